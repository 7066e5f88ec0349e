"""Init parity: the freshly initialised native model against upstream's own init, tensor by tensor.

Parity otherwise loads one checkpoint into both models, so it cannot see how the native model
starts when the recipe trains from scratch. Here each side's init is summarised before any
weight is loaded: upstream as transformers' `_init_weights` leaves it (`from_config` under a
seed, before parity perturbs its constants), the native model as its `init_weights(seed)`
leaves it, mapped to upstream's names by the workspace adapter's `to_hf`. Two independent
draws cannot agree element by element, so what is compared is the distribution
(numbers: `params:` of checklists/parity.yaml):

- a tensor upstream initialises to one value throughout (a norm weight 1, a bias 0) must be
  that value throughout natively, exactly;
- any other tensor with at least init_min_elements elements: the native std within
  init_std_rel of upstream's, the means within init_mean_stds of upstream's std. Smaller
  ones are pooled over the layers (`layers.*.mlp.gate.weight`) and judged as one sample
  when the pool is large enough, else listed as not judged.

With n >= 4096 elements a sample std is within about 1.1% of the true one (1/sqrt(2n)) and a
sample mean within 0.016 std, so the bounds sit several standard errors out: a failure is a
different init (a depth-scaled output projection, another initializer_range, a LayerNorm bias
set to 1), not chance.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from titan_core.measure.numerics import rel

LAYER_INDEX = re.compile(r"\.\d+\.")


@dataclass(frozen=True)
class TensorStats:
    """What init parity keeps of one initialised tensor (the tensor itself is not kept)."""

    numel: int
    mean: float
    std: float
    """Population std."""
    constant: float | None
    """The one value every element holds, else None."""
    values: torch.Tensor | None = None
    """A float64 copy, kept only for a tensor small enough to be pooled with its kin of other layers."""


def tensor_stats(t: torch.Tensor, *, keep_below: int) -> TensorStats:
    """Mean, std and constancy of `t` (a float64 copy kept when numel < keep_below).

    Reduced in fp32, not on a float64 copy: a real-size embedding would take gigabytes twice
    over, and fp32 statistics are far inside the percent-level bounds they are judged by."""
    x = t.detach().flatten()
    n = x.numel()
    if not n:
        return TensorStats(0, math.nan, math.nan, None)
    std, mean = torch.std_mean(x.float(), correction=0)
    constant = float(x[0]) if bool((x == x[0]).all()) else None
    return TensorStats(n, float(mean), float(std), constant, x.double().clone() if n < keep_below else None)


def init_stats(sd: dict[str, torch.Tensor], names: set[str] | None, *, keep_below: int) -> dict[str, TensorStats]:
    """Stats of the floating-point tensors of `sd` (those in `names`, when given)."""
    return {
        k: tensor_stats(v, keep_below=keep_below)
        for k, v in sd.items()
        if (names is None or k in names) and isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def _judge(nat: TensorStats, up: TensorStats, params: dict[str, Any]) -> str | None:
    """Why the native init of one tensor (or pool) differs from upstream's; None when it agrees."""
    if up.constant is not None:
        if nat.constant == up.constant:
            return None
        got = f"{nat.constant!r} throughout" if nat.constant is not None else f"mean {nat.mean:.4g}, std {nat.std:.4g}"
        return f"upstream initialises it to {up.constant!r} throughout; native: {got}"
    std_err, mean_off = rel(nat.std, up.std), abs(nat.mean - up.mean)
    std_tol, mean_tol = float(params["init_std_rel"]), float(params["init_mean_stds"]) * up.std
    if std_err <= std_tol and mean_off <= mean_tol:
        return None
    return (
        f"std {nat.std:.4g} vs upstream {up.std:.4g} (rel {std_err:.3g}, bound {std_tol:g}), "
        f"mean {nat.mean:.4g} vs {up.mean:.4g} (bound +-{mean_tol:.3g})"
    )


def _pooled(stats: list[TensorStats]) -> TensorStats:
    return tensor_stats(torch.cat([s.values for s in stats]), keep_below=0)


def compare_init(
    native: dict[str, TensorStats], upstream: dict[str, TensorStats], params: dict[str, Any]
) -> dict[str, Any]:
    """Judge every tensor both sides have at one shape; returns the measurements and the detail.

    {"init_tensors_compared", "init_tensors_differing", "differing": [{tensor, why}],
    "not_judged": [names]}: a pool counts as one comparison and is named with `*` for its layers.
    """
    min_n = int(params["init_min_elements"])
    shared = sorted(k for k in upstream if k in native and native[k].numel == upstream[k].numel)
    differing, not_judged, compared = [], [], 0
    pools: dict[str, list[str]] = {}
    for k in shared:
        up = upstream[k]
        if up.constant is None and not (math.isfinite(up.std) and math.isfinite(up.mean)):
            not_judged.append(f"{k} (upstream init left non-finite values)")
        elif up.constant is None and up.numel < min_n:
            pools.setdefault(LAYER_INDEX.sub(".*.", k), []).append(k)
        else:
            compared += 1
            why = _judge(native[k], up, params)
            if why:
                differing.append({"tensor": k, "why": why})
    for pool, keys in sorted(pools.items()):
        if sum(upstream[k].numel for k in keys) < min_n:
            not_judged += [f"{k} ({upstream[k].numel} elements)" for k in keys]
            continue
        compared += 1
        why = _judge(_pooled([native[k] for k in keys]), _pooled([upstream[k] for k in keys]), params)
        if why:
            differing.append({"tensor": pool if len(keys) > 1 else keys[0], "why": why})
    return {
        "init_tensors_compared": compared,
        "init_tensors_differing": len(differing),
        "differing": differing,
        "not_judged": not_judged,
    }
