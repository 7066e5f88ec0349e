"""Parameter counts of a model, total and active per token, from its module tree.

"Active" is what one token's forward touches: every parameter except the routed experts a
token is not sent to. One rule for every model (native family, port, transformers path):

- a routed-experts container is a module with a child named `experts` (the routed experts;
  a shared expert sits beside it under another name and counts in full);
- it holds `n_experts` and uses `top_k` per token: the container's own attributes (the common
  `MoE` block, a port that keeps its contract), else the model's args (`model.args.n_experts`,
  `.top_k`: on the transformers path the blocks are transformers' own classes, and the args are
  read from the same config). A container with neither (a model that routes nothing) is not one;
- under `experts`, a tensor whose first dimension is n_experts holds one slice per expert
  (transformers' and the common block's stacked [E, ...] layout), and a list of n_experts
  modules holds one expert each: of those, top_k / n_experts count as active. Anything else
  there (a bias every token's output gets) counts in full.

The router and everything else count in full; the embedding counts too (it is a lookup, not a
matmul; `stats.flops_per_token` is where that distinction matters).

Counting the module tree (on meta: no memory, seconds even at 235B) rather than a closed
form keeps the count true to what the model class builds, for native families and ports alike.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.decoder import Transformer

EXPERTS_CHILD = "experts"
"""The child of a MoE block that holds its routed experts."""


class ParamCounts(NamedTuple):
    total: int
    """Every parameter once (a tied head shares the embedding's)."""
    active: int
    """Parameters one token's forward uses: total less the unchosen routed experts."""


def count_params(model_or_args: nn.Module | TransformerArgs) -> ParamCounts:
    """(total, active) of a model, or of the shared decoder built on meta from `args`.

    Exact integers: the routed share of a container is a multiple of n_experts by construction
    (one slice or one module per expert)."""
    if isinstance(model_or_args, TransformerArgs):
        model = _meta_decoder(model_or_args)
    elif isinstance(model_or_args, nn.Module):
        model = model_or_args
    else:
        raise TypeError(f"count_params takes an nn.Module or TransformerArgs, not {type(model_or_args).__name__}")
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    args = getattr(model, "args", None)
    inactive = 0
    for module in model.modules():
        routing = _routing(module, args)
        if routing is not None:
            n, k = routing
            inactive += _per_expert(getattr(module, EXPERTS_CHILD), n) // n * (n - k)
    return ParamCounts(total=total, active=total - inactive)


def _routing(module: nn.Module, args) -> tuple[int, int] | None:
    """(n_experts, top_k) of a routed-experts container, or None for any other module."""
    if not isinstance(getattr(module, EXPERTS_CHILD, None), nn.Module):
        return None
    if hasattr(module, "n_experts") and hasattr(module, "top_k"):
        n, k = int(module.n_experts), int(module.top_k)
    elif isinstance(args, TransformerArgs) and args.n_experts:
        n, k = int(args.n_experts), int(args.top_k)
    else:
        return None
    return (n, k) if 0 < k <= n else None


def _per_expert(experts: nn.Module, n: int) -> int:
    """Parameters of `experts` held one share per expert (see the module docstring)."""
    if isinstance(experts, (nn.ModuleList, nn.ModuleDict)) and len(experts) == n:
        return sum(p.numel() for p in experts.parameters())
    # parameters(), not named: a tensor shared between two experts' slots is one tensor
    return sum(p.numel() for p in experts.parameters() if p.dim() and p.shape[0] == n)


def _meta_decoder(args: TransformerArgs) -> nn.Module:
    # the family classes only validate args; the module tree is the shared decoder's
    with torch.device("meta"):
        return Transformer(args)
