"""Capture-friendly MoE experts: every shape is static, nothing waits for the device.

The reference `Experts` loop gathers each expert's tokens with `torch.where`, whose
output size depends on the routing: a host sync in eager, a graph break under
torch.compile, and a data-dependent shape (or a baked-in routing) in a captured graph.
`DenseExperts` is dropless and static instead: every expert runs on every token as one
batched matmul, and a combine matrix [tokens, experts] that holds the router weight
where a token chose the expert and exactly 0 elsewhere mixes the outputs. Adding the
experts in index order onto zeros, as the loop does, gives the same sums.

Cost: n_experts / top_k times the expert FLOPs of the loop (4x for the debug models),
acceptable for the debug shapes this is for; a grouped-matmul kernel is the fast path.
Selected with `kernels.moe = "dense"` (the `moe.dense` swap, module path `layers.*.moe.experts`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from titan_core.models.common.swaps import register_swap
from titan_core.models.common.moe import Experts


class DenseExperts(Experts):
    """Same weights and interface as `Experts`; static shapes, no data-dependent indexing."""

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, expert_weights=None
    ) -> torch.Tensor:
        """x: [tokens, dim]; weights, experts: [tokens, top_k]; expert_weights as in `Experts.forward`."""
        w1, w3, w2 = self.expert_weights(expert_weights)
        combine = torch.zeros(x.shape[0], w1.shape[0], dtype=weights.dtype, device=x.device)
        combine = combine.scatter(1, experts, weights)  # top-k indices are distinct per token
        h = F.silu(torch.matmul(x, w1)) * torch.matmul(x, w3)  # [experts, tokens, hidden]
        y = torch.matmul(h, w2)  # [experts, tokens, dim]
        out = torch.zeros_like(x)
        # unbind, not y[e]: each select's backward would zero-fill all of y (see moe.Experts)
        for e, y_e in enumerate(y.unbind(0)):
            out = out + y_e * combine[:, e, None]
        return out


def _dense_from(old: Experts, path: str) -> DenseExperts:
    if old.w1 is None:  # a kernel handed its weights by the module above it stays weightless
        return DenseExperts.without_weights()
    n_experts, dim, hidden = old.w1.shape
    with torch.device(old.w1.device):
        return DenseExperts(n_experts, dim, hidden)


# Replaces the reference `Experts` and, through `produces`, the kernels registered for the
# same path (titan_core.kernels.swaps); a model's own experts class is never replaced.
register_swap(
    "moe.dense",
    "layers.*.moe.experts",
    "dropless static-shape experts (all experts on all tokens, masked combine)",
    replaces=Experts,
    produces=DenseExperts,
)(_dense_from)
