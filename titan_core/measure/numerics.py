"""How two results are compared: the one place that defines a relative error.

    rel_l2(actual, expected)      ||actual - expected||_2 / ||expected||_2, tensors (floor= below)
    grad_noise(grads, tokens)     a gradient's fp32 rounding level, below which two gradients agree
    grad_rel_l2(a, e, noise)      rel_l2 of one parameter's gradient, with that rule
    max_abs(actual, expected)     max |actual - expected|, tensors
    rel(value, reference)         |value - reference| / |reference|, Python numbers
    curve_max_rel(curve, ref)     the worst `rel` over two equally long curves, and its step

Norms and differences are taken in float64 whatever the inputs' dtype, so an fp32
comparison is not limited by the arithmetic of the comparison itself.

**The zero-reference rule** (one rule for every comparison and test): when the reference is
exactly zero, the error is 0.0 if the value is zero too and `inf` otherwise. A relative
error of something non-zero against nothing is unbounded; reporting the absolute
difference instead would let a kernel that writes small garbage where the plain path
writes zeros (an expert that got no token) pass a relative threshold. A missing tensor
(`None`, a parameter without a gradient) is a zero tensor. NaN anywhere gives `inf` (it is
the worst disagreement, and compares as one).
"""

from __future__ import annotations

import math

import torch


def _ratio(diff: float, ref: float) -> float:
    if math.isnan(diff) or math.isnan(ref):
        return math.inf
    if ref == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / ref


def rel_l2(actual: torch.Tensor | None, expected: torch.Tensor | None) -> float:
    """Relative L2 error of `actual` against `expected` (the zero-reference rule above).

    `None` is a zero tensor of the other side's shape: a parameter that got no gradient
    (an expert no token was routed to) has a zero gradient, so one side's None against the
    other side's zeros is agreement, wherever the comparison is made. Shapes must match.
    """
    if actual is None and expected is None:
        return 0.0
    if actual is None:
        actual = torch.zeros_like(expected)
    if expected is None:
        expected = torch.zeros_like(actual)
    a, e = actual.detach(), expected.detach()
    if a.shape != e.shape:
        raise ValueError(f"rel_l2: shapes differ, {tuple(a.shape)} vs {tuple(e.shape)}")
    diff = torch.linalg.vector_norm(a.double() - e.double()).item()
    ref = torch.linalg.vector_norm(e.double()).item()
    return _ratio(diff, ref)


FP32_EPS = float(torch.finfo(torch.float32).eps)


def grad_noise(grads, tokens: int = 1) -> float:
    """The fp32 rounding level of a model's gradient over `tokens` tokens: eps(fp32) x sqrt(tokens)
    x the whole gradient's L2 norm (a parameter's gradient is a sum over the tokens; its rounding
    grows like the square root of their number). None entries count as zero.

    A gradient that is zero in exact arithmetic but not in rounding (a key bias that softmax
    cancels: BART, BERT, OPT) sits far below it (1e-12 against 2 in BART), and two models'
    roundings of it differ by 100% of themselves: below this level both are noise and agree. A
    reference that is exactly zero keeps the zero-reference rule (an expert no token reached).
    """
    total = sum(float(torch.linalg.vector_norm(g.detach().double()).item()) ** 2 for g in grads if g is not None)
    return FP32_EPS * math.sqrt(max(1, tokens)) * math.sqrt(total)


def _l2(t: torch.Tensor | None) -> float:
    return 0.0 if t is None else float(torch.linalg.vector_norm(t.detach().double()).item())


def grad_rel_l2(actual: torch.Tensor | None, expected: torch.Tensor | None, noise: float) -> float:
    """`rel_l2` of one parameter's gradient, except that a non-zero reference at or below `noise`
    (`grad_noise` of the whole reference gradient) that the other side also computes at or below
    it agrees (0.0): both are roundings of an exact zero. An exactly zero reference keeps the
    zero-reference rule."""
    if 0 < _l2(expected) <= noise and _l2(actual) <= noise:
        return 0.0
    return rel_l2(actual, expected)


def rounding_check(candidate, reference, exact, factor: float) -> dict[str, float | bool]:
    """Whether `candidate`'s difference from `reference` (two fp32 results of one computation) is fp32
    rounding: both measured against `exact` (the reference computed in fp64), the candidate is within
    `factor` x the reference's own error. A gradient that is a sum which cancels (a scalar multiplier's, a
    decay rate's) has an fp32 error far above eps; two correct fp32 paths then differ by that much,
    and a path that is wrong lands further from fp64 than the reference does."""
    c, r = rel_l2(candidate, exact), rel_l2(reference, exact)
    return {"candidate_vs_fp64": c, "reference_vs_fp64": r, "rounding": c <= factor * r}


def worst_unexcused(errors: dict[str, float], rounding: dict[str, dict]) -> tuple[str | None, float]:
    """(name, error) of the worst of `errors` that `rounding` (name -> rounding_check) does not excuse
    as fp32 rounding; (None, 0.0) when every one is excused or there are none."""
    judged = {n: e for n, e in errors.items() if not rounding.get(n, {}).get("rounding")}
    worst = max(judged, key=judged.get, default=None)
    return worst, judged[worst] if worst is not None else 0.0


def max_abs(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute elementwise difference in float64 (0.0 for empty tensors, inf for NaN)."""
    if actual.numel() == 0:
        return 0.0
    d = (actual.detach().double() - expected.detach().double()).abs().max().item()
    return math.inf if math.isnan(d) else d


def rel(value: float, reference: float) -> float:
    """|value - reference| / |reference| for two numbers (the zero-reference rule above)."""
    if value == reference:
        return 0.0
    return _ratio(abs(value - reference), abs(reference))


def curve_max_rel(curve: list[float], reference: list[float]) -> tuple[float, int | None]:
    """(worst `rel` over the steps, its 1-based step); (inf, None) when the curves differ in length or are empty."""
    if not curve or len(curve) != len(reference):
        return math.inf, None
    errs = [rel(a, b) if math.isfinite(a) else math.inf for a, b in zip(curve, reference)]
    worst = max(range(len(errs)), key=lambda i: errs[i])
    return errs[worst], worst + 1
