"""Gradient clipping and AdamW as pure functions over tensor lists, for the captured step.

Both compute, op for op, what the eager trainer runs: the norm is the trainer's own
`parallel.grads.total_norm` (fp64 accumulation), the clipping mirrors its scaling, and
the update mirrors `torch.optim.AdamW`'s single-tensor path (the one torch picks for CPU
parameters). That is what makes the captured step bit-identical to eager: same kernels,
same order, same scalar values. The only difference is where scalars that change every
step come from: eager computes them in Python doubles and passes them to each op as a
Scalar; here the host computes the very same doubles (`adamw_step_scalars`) and feeds
them to the graph as 0-dim fp32 tensors, which the kernels read as exactly the value
the Scalar path would have used for fp32 parameters. Constants (betas, eps) stay baked
into the graph. bf16 parameters too: the one fused op whose decomposition would round
differently (addcdiv, one rounding in fp32 "opmath") is written in fp32 and rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from titan_core.compile.graph_trainer.params import as_param
from titan_core.parallel.grads import total_norm

#: scalar inputs per parameter group, in the order `adamw_step_scalars` returns them
STEP_SCALARS = ("decay_mul", "bias_correction2_sqrt", "neg_step_size")


@dataclass(frozen=True)
class GroupHyper:
    """The constant hyperparameters of one AdamW param group."""

    beta1: float
    beta2: float
    eps: float
    weight_decay: float


class UnsupportedOptimizer(ValueError):
    """The eager optimizer uses a feature the functional AdamW does not mirror."""


def group_hypers(optimizer: torch.optim.Optimizer) -> list[GroupHyper]:
    """Check the optimizer is an AdamW the functional update mirrors, and read its constants."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise UnsupportedOptimizer(f"graph trainer mirrors AdamW only, got {type(optimizer).__name__}")
    hypers = []
    for i, g in enumerate(optimizer.param_groups):
        for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
            if g.get(flag):
                raise UnsupportedOptimizer(f"param group {i}: AdamW option {flag}=True is not supported")
        if g.get("fused"):
            raise UnsupportedOptimizer(
                f"param group {i}: fused AdamW is not supported (its kernel is not traceable op for op)"
            )
        if not g.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW)):
            raise UnsupportedOptimizer(f"param group {i}: coupled (Adam-style) weight decay is not supported")
        beta1, beta2 = (float(b) for b in g["betas"])
        hypers.append(GroupHyper(beta1, beta2, float(g["eps"]), float(g["weight_decay"])))
    return hypers


def adamw_step_scalars(lr: float, step: int, h: GroupHyper) -> tuple[float, float, float]:
    """The per-step scalars of one group, computed exactly as torch's single-tensor AdamW does.

    `step` is the 1-based step the update is about to make (the state's step after `+= 1`).
    """
    step = float(step)  # eager reads the float32 step tensor back as a Python float
    bias_correction1 = 1 - h.beta1**step
    bias_correction2 = 1 - h.beta2**step
    step_size = lr / bias_correction1
    return 1 - lr * h.weight_decay, bias_correction2**0.5, -step_size


def adamw_update(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    group_of: list[int],
    hypers: list[GroupHyper],
    scalars: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """One AdamW step, out of place. `scalars[g]` are group g's STEP_SCALARS as 0-dim tensors."""
    new_p, new_m, new_v = [], [], []
    for p, g, m, v, gi in zip(params, grads, exp_avgs, exp_avg_sqs, group_of):
        h = hypers[gi]
        decay_mul, bc2_sqrt, neg_step_size = scalars[gi]
        if h.weight_decay != 0:
            p = p * decay_mul
        m = torch.lerp(m, g, 1 - h.beta1)
        v = torch.addcmul(v * h.beta2, g, g, value=1 - h.beta2)
        denom = (torch.sqrt(v) / bc2_sqrt) + h.eps
        # addcdiv(p, m, denom, value=s) computes p + (s * m) / denom in fp32 ("opmath") and rounds
        # once to p's dtype: for fp32 the casts are no-ops and the same three roundings remain; for
        # bf16 parameters the decomposed ops would round each step in bf16
        p = (p.float() + (neg_step_size * m.float()) / denom.float()).to(p.dtype)
        new_p.append(p)
        new_m.append(m)
        new_v.append(v)
    return new_p, new_m, new_v


def global_norm(grads: list[torch.Tensor], specs: list) -> torch.Tensor:
    """The norm the eager trainer's `parallel.clip_grad_norm_` computes, over local gradient shards.

    On one rank (no spec, or one-rank meshes) the local tensors are the whole gradients:
    plain `total_norm`. On a real mesh the shards are rebuilt as DTensors and the norm is
    taken by DTensor (replicated copies counted once), then made global, as in eager.
    """
    if all(s is None or s.mesh.size() == 1 for s in specs):
        return total_norm(grads)
    norm = total_norm([as_param(g, s) for g, s in zip(grads, specs)])
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_by_norm(grads: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> list[torch.Tensor]:
    """grads * min(max_norm / (norm + 1e-6), 1), out of place; group order as in eager."""
    clip_coef = float(max_norm) / (norm + 1e-6)
    coef = torch.clamp(clip_coef, max=1.0)
    index: dict[tuple, list[int]] = {}
    for i, g in enumerate(grads):
        index.setdefault((g.device, g.dtype), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(grads)
    for (device, _), idx in index.items():
        scaled = torch._foreach_mul([grads[i] for i in idx], coef.to(device))
        for i, s in zip(idx, scaled):
            out[i] = s
    return out  # type: ignore[return-value]
