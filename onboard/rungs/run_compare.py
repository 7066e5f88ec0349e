"""Compare runs: a run's steady window (speed, memory) and the same beside the eager rung's evidence:
ratios of runs timed apart, context only (no interval, no outcome: gates.TIMED_APART)."""

from __future__ import annotations

from typing import Any

from onboard.ladder.contract import RungContext
from onboard.ladder.gates import timed_apart
from onboard.ladder.measurements.training_measurements import BesideEager
from titan_core.measure.run_stats import RunStats


def run_stats(rows: list[dict]) -> dict[str, Any]:
    """The steady-state speed and memory measurements of one run's rows (titan_core.measure.run_stats)."""
    return RunStats.from_rows(rows).measurements()


def beside_eager(m: BesideEager, evidence: dict) -> None:
    """Put this run's median step time and peak memory beside the eager rung's, as context: the two
    runs were timed apart, so their ratio has no interval and says no faster or slower (what the
    recipe keeps is decided by interleaved comparisons: onboard.ladder.decision)."""
    ev = evidence.get("eager") or {}
    m.eager_step_time_median_s = ev.get("step_time_median_s")
    m.eager_peak_mem_bytes = ev.get("peak_mem_bytes")
    if ev.get("step_time_median_s"):
        m.speedup_vs_eager = ev["step_time_median_s"] / m.step_time_median_s
    m.vs_eager_context = timed_apart(m.step_time_median_s, ev.get("step_time_median_s"), "eager")
    if ev.get("peak_mem_bytes"):
        m.peak_mem_vs_eager = m.peak_mem_bytes / ev["peak_mem_bytes"]


def eager_step1_loss(ctx: RungContext) -> float:
    """The eager rung's exact step-1 loss (the ladder runs this rung only after eager passed)."""
    ev = ctx.evidence.get("eager")
    if not ev or "step1_loss" not in ev:
        raise RuntimeError("no passed eager evidence to compare with: run the eager rung first")
    return float(ev["step1_loss"])  # JSON keeps a float exactly; float() reads a non-finite one's "nan"
