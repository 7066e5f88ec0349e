"""Grouped expert matmuls: dropless MoE experts with tokens sorted by expert.

The reference (`Experts` in models/common/moe.py) loops over experts. These replace its
forward and keep its parameters (w1/w3 [E, dim, hidden], w2 [E, hidden, dim], the same
Parameter objects; none when the replaced module holds none and is handed its weights), so
state dicts and initialisation are unchanged:

- `GroupedMMExperts`: `torch._grouped_mm` over the sorted rows (CPU and CUDA);
- `TokamaxExperts`: tokamax `ragged_dot` through the JAX bridge.

Sorting: each (token, slot) pair is one row; rows are ordered by expert (stable), group
sizes counted with a fixed-size scatter (no data-dependent shapes, so torch.compile and
make_fx keep one graph), and the outputs scattered back with index_add, weighted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from titan_core.kernels.attention import KernelUnavailable, jax_kernels_or_reason
from titan_core.models.common.moe import Experts


def sort_by_expert(experts: torch.Tensor, n_experts: int):
    """experts [tokens, top_k] -> (row order, token of each sorted row, group sizes [E])."""
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    return order, order // experts.shape[1], counts


class _SortedExperts(Experts):
    """Shared plumbing: adopt the replaced module's parameters, sort, combine."""

    def __init__(self, old: Experts):
        torch.nn.Module.__init__(self)
        self.w1, self.w3, self.w2 = old.w1, old.w3, old.w2

    def _matmul(self, rows: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, expert_weights=None
    ) -> torch.Tensor:
        """x: [tokens, dim]; weights, experts: [tokens, top_k]; expert_weights as in `Experts.forward`."""
        w1, w3, w2 = self.expert_weights(expert_weights)
        order, token, counts = sort_by_expert(experts, w1.shape[0])
        rows = x[token]
        h = F.silu(self._matmul(rows, w1, counts)) * self._matmul(rows, w3, counts)
        out = self._matmul(h, w2, counts) * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add(0, token, out)


def grouped_mm_unsupported(
    device: torch.device | str, dtype: torch.dtype, dim: int, hidden: int, *, captured: bool = False
) -> str | None:
    """Why `torch._grouped_mm` cannot run the experts here, or None when it can.

    `captured`: the step runs under torch.compile or is traced by make_fx (Graph Trainer).
    torch 2.13's CPU kernel takes any float dtype, but its meta function (which every
    trace uses) mirrors the CUDA kernel and accepts bf16 only.
    """
    # A string is read without torch.device(): "tpu" only parses once torch_tpu is loaded.
    device_type = device.split(":")[0] if isinstance(device, str) else device.type
    if device_type not in ("cpu", "cuda"):
        return f"torch._grouped_mm has kernels for CPU and CUDA only, not {device_type}; use moe=loop or tokamax"
    if dtype != torch.bfloat16 and (device_type == "cuda" or captured):
        where = "on CUDA" if device_type == "cuda" else "under torch.compile / make_fx (its meta function)"
        return f"torch._grouped_mm takes bf16 only {where}, not {dtype}; use moe=loop or tokamax, or bf16"
    size = torch.empty((), dtype=dtype).element_size()
    bad = [f"{name}={n}" for name, n in (("dim", dim), ("moe_hidden_dim", hidden)) if (n * size) % 16]
    if bad:
        return (
            f"torch._grouped_mm needs rows of a multiple of 16 bytes; {', '.join(bad)} in {dtype} "
            f"({size} bytes each) is not; use moe=loop or tokamax"
        )
    return None


def _captured(x: torch.Tensor) -> bool:
    """Is this call being traced (dynamo, fake tensors, or make_fx's proxy mode)?"""
    return torch.compiler.is_compiling() or is_fake(x) or get_proxy_mode() is not None


class GroupedMMExperts(_SortedExperts):
    """Experts as three `torch._grouped_mm` calls over expert-sorted rows."""

    def _matmul(self, rows, weight, counts):
        return torch._grouped_mm(rows, weight, offs=torch.cumsum(counts, 0).to(torch.int32))

    def forward(self, x, weights, experts, expert_weights=None):
        w1 = self.expert_weights(expert_weights)[0]
        reason = grouped_mm_unsupported(x.device, x.dtype, w1.shape[1], w1.shape[2], captured=_captured(x))
        if reason:
            raise KernelUnavailable(f"kernels.moe=grouped_mm: {reason}")
        return super().forward(x, weights, experts, expert_weights)


class TokamaxExperts(_SortedExperts):
    """Experts as three tokamax `ragged_dot` calls through the JAX bridge."""

    def __init__(self, old: Experts, implementation: str = "device"):
        super().__init__(old)
        self.implementation = implementation
        self._ops = jax_kernels_or_reason("tokamax_ops", "kernels.moe=tokamax")

    def _matmul(self, rows, weight, counts):
        if isinstance(self._ops, KernelUnavailable):
            raise self._ops
        ragged_dot = self._ops.ragged_dot
        impl = self.implementation
        if impl == "device":
            impl = {"cpu": "xla", "tpu": "mosaic"}.get(rows.device.type, "auto")
        return ragged_dot(rows, weight, counts, implementation=impl)

    def extra_repr(self) -> str:
        return f"implementation={self.implementation}"
