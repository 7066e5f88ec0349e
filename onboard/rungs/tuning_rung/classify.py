"""The numerics class of one change, from step 1 of two runs that differ only by it.

    bit_identical   step-1 loss and grad norm equal as repr floats
    rounding        both within `rounding_rel` relative error (titan_core.measure.numerics.rel)
    diverged        anything else, a non-finite value included: the change is rejected

A rounding change may still compound over steps, so it is kept only with a loss curve over
a number of steps within a tolerance of the baseline curve (`curve_check`). Both thresholds
come from the caller (a checklist), never from here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from titan_core.measure.numerics import curve_max_rel, rel

CLASSES = ("bit_identical", "rounding", "diverged")


@dataclass(frozen=True)
class Step1:
    """Step-1 loss and grad norm of one run (what the change is judged on)."""

    loss: float
    grad_norm: float

    @classmethod
    def from_row(cls, row: dict) -> "Step1":
        """From a trainer's metrics row (`loss`, `grad_norm`)."""
        return cls(float(row["loss"]), float(row["grad_norm"]))

    def to_dict(self) -> dict:
        return {"loss": self.loss, "grad_norm": self.grad_norm}


@dataclass(frozen=True)
class Classification:
    cls: str
    """bit_identical | rounding | diverged."""
    loss_rel: float
    grad_norm_rel: float
    rounding_rel: float
    """The threshold it was judged against."""
    why: str

    @property
    def rejected(self) -> bool:
        return self.cls == "diverged"

    def to_dict(self) -> dict:
        return asdict(self)


def classify(candidate: Step1, baseline: Step1, *, rounding_rel: float) -> Classification:
    """The class of `candidate` against `baseline` (see the module docstring)."""
    loss_rel, norm_rel = rel(candidate.loss, baseline.loss), rel(candidate.grad_norm, baseline.grad_norm)
    finite = all(math.isfinite(x) for x in (candidate.loss, candidate.grad_norm))
    if not finite:
        loss_rel = norm_rel = math.inf
    if finite and repr(candidate.loss) == repr(baseline.loss) and repr(candidate.grad_norm) == repr(baseline.grad_norm):
        return Classification("bit_identical", 0.0, 0.0, rounding_rel,
                              "step-1 loss and grad norm equal as repr floats")  # fmt: skip
    worst = max(loss_rel, norm_rel)
    which = "loss" if loss_rel >= norm_rel else "grad norm"
    if worst <= rounding_rel:
        return Classification("rounding", loss_rel, norm_rel, rounding_rel,
                              f"step-1 {which} differs by {worst:.1e} relative, within {rounding_rel:.0e}")  # fmt: skip
    what = "is not finite" if not finite else f"differs by {worst:.1e} relative, beyond {rounding_rel:.0e}"
    return Classification("diverged", loss_rel, norm_rel, rounding_rel, f"step-1 {which} {what}: rejected")


@dataclass(frozen=True)
class CurveCheck:
    ok: bool
    worst_rel: float
    worst_step: int | None
    steps: int
    tolerance: float

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        where = f" at step {self.worst_step}" if self.worst_step else ""
        verdict = "within" if self.ok else "beyond"
        worst = f"worst rel {self.worst_rel:.1e}{where}"
        return f"loss curve over {self.steps} steps: {worst}, {verdict} {self.tolerance:.0e}"


def curve_check(curve: list[float], baseline: list[float], *, tolerance: float) -> CurveCheck:
    """Whether a rounding change's loss curve stays within `tolerance` (relative, every step) of the
    baseline's; curves of different lengths (a run that stopped early) fail."""
    worst, step = curve_max_rel(curve, baseline)
    return CurveCheck(ok=worst <= tolerance, worst_rel=worst, worst_step=step, steps=len(baseline), tolerance=tolerance)
