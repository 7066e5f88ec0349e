"""Mixture of experts: top-k softmax router, experts behind one swappable module.

`Experts` holds the weights of all experts as 3-D tensors and computes them with a plain
per-expert loop: that loop is the reference every faster expert kernel is compared with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.layers import FeedForward


class Router(nn.Module):
    """Softmax over experts in fp32, top-k, optional renormalisation of the kept weights.

    forward(x [tokens, dim]) -> (probs [tokens, n_experts] fp32, weights [tokens, top_k] in
    x's dtype, experts [tokens, top_k] int64, distinct per token). The scores come from one
    Linear(dim, n_experts) with no bias. `probs` feeds the load-balancing loss.
    """

    def __init__(self, dim: int, n_experts: int, top_k: int, norm_topk_prob: bool):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(dim, n_experts, bias=False)

    def forward(self, x: torch.Tensor):
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights.to(x.dtype), experts


class Experts(nn.Module):
    """SwiGLU experts; w1/w3: [experts, dim, hidden], w2: [experts, hidden, dim].

    Weights are applied as `x @ w` (the transpose of nn.Linear's [out, in]). Every experts
    kernel (swap path `layers.*.moe.experts`) keeps this forward contract and these weights,
    or holds none and is handed them (`without_weights`, `expert_weights=`).
    """

    def __init__(self, n_experts: int, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))

    @classmethod
    def without_weights(cls) -> "Experts":
        """This kernel holding no weights (w1 = w3 = w2 = None): every call passes them as `expert_weights`.

        For a module that keeps its experts' weights itself, in another layout and under its own
        names (transformers' `gate_up_proj` / `down_proj`), and computes through this kernel.
        """
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.w1 = self.w3 = self.w2 = None
        return self

    def expert_weights(self, given: tuple | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w1, w3, w2): `given` when the caller passes them, else this module's own."""
        return given if given is not None else (self.w1, self.w3, self.w2)

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, expert_weights=None
    ) -> torch.Tensor:
        """x: [tokens, dim]; weights, experts: [tokens, top_k]; expert_weights: (w1, w3, w2) in this
        layout to compute with instead of the module's own (None: its own)."""
        # Read each weight once: under SimpleFSDP every attribute read is an all-gather. Split
        # with unbind, not w[e]: each select's backward is a zero-filled gradient of the whole
        # [experts, ...] tensor, so 128 experts cost 128 full-size buffers (seconds per step on
        # a CPU); unbind's backward stacks the slices once, with the same values.
        w1, w3, w2 = (w.unbind(0) for w in self.expert_weights(expert_weights))
        out = torch.zeros_like(x)
        for e in range(len(w1)):
            token, slot = torch.where(experts == e)
            h = x[token]
            h = (F.silu(h @ w1[e]) * (h @ w3[e])) @ w2[e]
            out = out.index_add(0, token, h * weights[token, slot, None])
        return out


class MoE(nn.Module):
    """Router, experts and an optional shared expert; forward(x [..., dim]) -> (out, aux).

    Tokens are flattened to [tokens, dim] for routing. The shared expert (a FeedForward of
    `shared_hidden_dim`) is added to every token unscaled; a model that scales it per token
    (Qwen2-MoE: by a sigmoid of a Linear(dim, 1)) needs its own MoE. `aux` is this layer's
    `routing_stats`: the model sums them over its MoE layers and turns the sum into the
    load-balancing loss once (`load_balancing_loss`), as transformers pools every layer's tokens.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        n_experts: int,
        top_k: int,
        *,
        norm_topk_prob: bool = True,
        shared_hidden_dim: int = 0,
    ):
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.router = Router(dim, n_experts, top_k, norm_topk_prob)
        self.experts = Experts(n_experts, dim, hidden_dim)
        self.shared_expert = FeedForward(dim, shared_hidden_dim) if shared_hidden_dim else None

    def forward(self, x: torch.Tensor):
        """Returns (output, routing statistics of this layer: `routing_stats`)."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs, weights, experts = self.router(flat)
        out = self.experts(flat, weights, experts)
        if self.shared_expert is not None:
            out = out + self.shared_expert(flat)
        return out.reshape(shape), routing_stats(probs, experts, self.n_experts)


def routing_stats(probs: torch.Tensor, experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """One MoE layer's share of the load-balancing loss: [2, n_experts] fp32.

    Row 0: the fraction of the layer's tokens routed to each expert (its top-k slots counted,
    so the row sums to top_k); row 1: each expert's mean router probability. A per-token mean
    per layer: the model adds the layers' rows and `load_balancing_loss` divides by their count,
    which is the mean over all layers' tokens that transformers takes (every layer routes the
    same tokens).
    """
    routed = F.one_hot(experts, n_experts).float().sum(dim=1)  # [tokens, experts]
    return torch.stack((routed.mean(dim=0), probs.float().mean(dim=0)))


def load_balancing_loss(stats: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Switch-style auxiliary loss over every MoE layer at once, as transformers'
    `load_balancing_loss_func` (Mixtral, Qwen-MoE) computes it without an attention mask:
    n_experts * sum_e (fraction routed to e) * (mean probability of e), both means over the
    tokens of all `n_layers` layers, `stats` the sum of their `routing_stats`.

    Not a sum of per-layer losses (that is about n_layers times larger). Equals top_k when
    routing is perfectly uniform; grows as routing collapses. Unweighted: the model multiplies
    by aux_loss_coef (router_aux_loss_coef) where the config turns the loss on.
    """
    fraction, prob = stats / n_layers
    return stats.shape[-1] * (fraction * prob).sum()
