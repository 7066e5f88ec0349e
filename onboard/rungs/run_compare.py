"""Compare runs: a run's steady window (speed, memory) and the same beside the eager rung's evidence
(ratios, and the timing protocol's interval on the step-time ratio)."""

from __future__ import annotations

from typing import Any

from onboard.ladder.contract import RungContext
from onboard.ladder.measurements.training_measurements import BesideEager
from titan_core.measure.run_stats import RunStats
from titan_core.measure.timing import compare_samples


def run_stats(rows: list[dict]) -> dict[str, Any]:
    """The steady-state speed and memory measurements of one run's rows (titan_core.measure.run_stats)."""
    return RunStats.from_rows(rows).measurements()


def beside_eager(m: BesideEager, evidence: dict) -> None:
    """Put this run's step times and peak memory beside the eager rung's: ratios, and the
    timing protocol's interval on the step-time ratio (two runs timed apart: unpaired)."""
    ev = evidence.get("eager") or {}
    m.eager_step_time_median_s = ev.get("step_time_median_s")
    m.eager_peak_mem_bytes = ev.get("peak_mem_bytes")
    if ev.get("step_time_median_s"):
        m.speedup_vs_eager = ev["step_time_median_s"] / m.step_time_median_s
    cmp = compare_samples(m.get("step_times_s") or [], ev.get("step_times_s") or [])
    m.vs_eager = cmp.to_dict() if cmp else None
    m.vs_eager_text = cmp.describe("this run", "eager") if cmp else "no interval (eager evidence has no step times)"
    m.speedup_vs_eager_ci = cmp.short() if cmp else None
    if ev.get("peak_mem_bytes"):
        m.peak_mem_vs_eager = m.peak_mem_bytes / ev["peak_mem_bytes"]


def eager_step1_loss(ctx: RungContext) -> float:
    """The eager rung's exact step-1 loss (the ladder runs this rung only after eager passed)."""
    ev = ctx.evidence.get("eager")
    if not ev or "step1_loss_repr" not in ev:
        raise RuntimeError("no passed eager evidence to compare with: run the eager rung first")
    return float(ev["step1_loss_repr"])
