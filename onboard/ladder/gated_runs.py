"""What every rung that trains records of its runs: the precision they computed in, and that
each ran whole (every planned step, a finite loss and grad norm at every one).

"Passed" means the recipe ran as planned: a gate whose run stopped at step 2 of 20, or logged a
NaN grad norm with a finite loss, proves nothing about the steps it did not run. So each gated
run is recorded on the attempt's `RungContext.runs` (`record_run`; `train_run.train` does it for
every in-process run) and the engine sets `runs_whole` from them (`runs_verdict`), which every
training rung's checklist requires. Not a rung (no RUNG); loads no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onboard.ladder.contract import ABSENT, Measurements, RungContext
from titan_core.measure.run_stats import not_whole


@dataclass(kw_only=True)
class GatedRuns(Measurements):
    """What every rung that trains records of its runs: their precision, and that each ran whole."""

    precision: str = ABSENT
    """fp32 | bf16: the precision the rung's runs of the recipe computed in (`gate_recipe.precision`); it picks the
    bound of each criterion that compares two runs (the checklist's threshold per precision)."""
    runs_whole: bool = ABSENT
    """Every gated run of the attempt ran all its planned steps with a finite loss and grad norm at
    every step (set by the engine from `record_run`; absent: the rung recorded no run)."""
    runs_recorded: int = ABSENT
    """Gated runs the attempt recorded (count)."""
    runs_not_whole: list[str] = ABSENT
    """Each run that was not whole: "<run>: <the step and the quantity, or where it stopped>"."""


def record_run(ctx: RungContext, label: str, rows: list[dict], planned: int) -> str | None:
    """Record one gated run on `ctx.runs`; returns why it is not whole (None: every planned step ran,
    its loss and grad norm finite). A gate passes only when every run it recorded is whole."""
    problem = not_whole(rows, planned)
    ctx.runs.append({"run": label, "steps_planned": planned, "steps_run": len(rows), "problem": problem})
    if problem:
        ctx.log(f"{label}: not whole: {problem}")
    return problem


def runs_verdict(runs: list[dict]) -> dict[str, Any]:
    """The `GatedRuns` measurements of an attempt's recorded runs (the engine sets them)."""
    broken = [f"{r['run']}: {r['problem']}" for r in runs if r["problem"]]
    return {"runs_whole": not broken, "runs_recorded": len(runs), "runs_not_whole": broken}


def settle_runs(measurements: Measurements, runs: list[dict]) -> None:
    """Set a training rung's `runs_whole` from the runs it recorded (the engine, after the rung returns)."""
    if runs and isinstance(measurements, GatedRuns):
        measurements.update(runs_verdict(runs))
