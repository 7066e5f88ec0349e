"""Parameter counts of a model, total and active per token, from its module tree.

"Active" is what one token's forward touches: every parameter except the routed experts a
token is not sent to. A routed-experts container is any module with `n_experts` and `top_k`
attributes and an `experts` child (the common `MoE` block, and a port that keeps its
contract): of the parameters under `experts`, top_k / n_experts count as active. A shared
expert, the router and everything else count in full; the embedding counts too (it is a
lookup, not a matmul; `stats.flops_per_token` is where that distinction matters).

Counting the module tree (on meta: no memory, seconds even at 235B) rather than a closed
form keeps the count true to what the model class builds, for native families and ports alike.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.decoder import Transformer


class ParamCounts(NamedTuple):
    total: int
    """Every parameter once (a tied head shares the embedding's)."""
    active: int
    """Parameters one token's forward uses: total less the unchosen routed experts."""


def count_params(model_or_args: nn.Module | TransformerArgs) -> ParamCounts:
    """(total, active) of a model, or of the shared decoder built on meta from `args`.

    Exact integers: each routed-experts container must hold a multiple of n_experts
    parameters (one equal share per expert), else ValueError.
    """
    if isinstance(model_or_args, TransformerArgs):
        model = _meta_decoder(model_or_args)
    elif isinstance(model_or_args, nn.Module):
        model = model_or_args
    else:
        raise TypeError(f"count_params takes an nn.Module or TransformerArgs, not {type(model_or_args).__name__}")
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    inactive = 0
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        if not (isinstance(experts, nn.Module) and hasattr(module, "n_experts") and hasattr(module, "top_k")):
            continue
        n, k = int(module.n_experts), int(module.top_k)
        held = sum(p.numel() for p in experts.parameters())
        if n <= 0 or held % n:
            raise ValueError(f"{name}.experts holds {held} parameters, not an equal share for each of {n} experts")
        inactive += held // n * (n - k)
    return ParamCounts(total=total, active=total - inactive)


def _meta_decoder(args: TransformerArgs) -> nn.Module:
    # the family classes only validate args; the module tree is the shared decoder's
    with torch.device("meta"):
        return Transformer(args)
