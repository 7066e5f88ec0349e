"""Compare runs: a run's steady window (speed, memory) and the same beside the eager rung's evidence:
ratios of runs timed apart, context only (no interval, no outcome: gates.TIMED_APART). Each returns a
part of a training rung's record (SteadyRun, BesideEager), built by keyword; the rung's `from_parts`
takes it in."""

from __future__ import annotations

from onboard.ladder.contract import ABSENT, RungContext
from onboard.ladder.gates import timed_apart
from onboard.ladder.measurements.training_measurements import BesideEager, SteadyRun
from titan_core.measure.run_stats import RunStats


def steady(rows: list[dict]) -> SteadyRun:
    """The steady-state speed and memory of one run's rows (titan_core.measure.run_stats)."""
    s = RunStats.from_rows(rows)
    return SteadyRun(steady_from=s.steady_from, step_time_median_s=s.step_time_median_s,
                     step_time_spread=s.step_time_spread, tokens_per_s=s.tokens_per_s, mfu=s.mfu,
                     peak_mem_bytes=s.peak_mem_bytes, step_times_s=s.step_times_s)  # fmt: skip


def beside_eager(run: SteadyRun, evidence: dict) -> BesideEager:
    """This run's median step time and peak memory beside the eager rung's, as context: the two runs
    were timed apart, so their ratio has no interval and says no faster or slower (what the recipe
    keeps is decided by interleaved comparisons: onboard.ladder.decision)."""
    ev = evidence.get("eager") or {}
    eager_time, eager_peak = ev.get("step_time_median_s"), ev.get("peak_mem_bytes")
    return BesideEager(
        eager_step_time_median_s=eager_time,
        eager_peak_mem_bytes=eager_peak,
        speedup_vs_eager=eager_time / run.step_time_median_s if eager_time else ABSENT,
        vs_eager_context=timed_apart(run.step_time_median_s, eager_time, "eager"),
        peak_mem_vs_eager=run.peak_mem_bytes / eager_peak if eager_peak else ABSENT,
    )


def eager_step1_loss(ctx: RungContext) -> float:
    """The eager rung's exact step-1 loss (the ladder runs this rung only after eager passed)."""
    ev = ctx.evidence.get("eager")
    if not ev or "step1_loss" not in ev:
        raise RuntimeError("no passed eager evidence to compare with: run the eager rung first")
    return float(ev["step1_loss"])  # JSON keeps a float exactly; float() reads a non-finite one's "nan"
