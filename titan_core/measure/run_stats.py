"""What one run's per-step rows say about its speed and memory: the steady window and its numbers.

Every consumer of a run's rows (the trainer's result, callers that judge runs, the benches)
reads speed through `RunStats.from_rows`, so "the step time of a run" means one thing:
the median over the steady window, with its spread, the first `warmup` steps left out
because they pay for allocator warm-up, lazy initialisation and compilation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

WARMUP_STEPS = 2
"""Steps left out at the start of a run, when the run is long enough to keep some (more than 2x this)."""


@dataclass(frozen=True)
class RunStats:
    steps: int
    """Rows the run logged."""
    steady_from: int
    """1-based step where the steady window starts (1: the run was too short to leave any out)."""
    step_time_median_s: float
    step_time_spread: float
    """Interquartile range of the steady step times over their median (0 with one step)."""
    tokens_per_s: float
    """Median over the steady window."""
    mfu: float
    """Median over the steady window (on CPU, against the best matmul rate seen on this machine: indicative)."""
    peak_mem_bytes: int
    """Most memory any step reached."""
    step_times_s: list[float] = field(default_factory=list)
    """The steady window's step times: what another run's times are compared with (titan_core.measure.timing)."""

    @classmethod
    def from_rows(cls, rows: list[dict], *, warmup: int = WARMUP_STEPS) -> "RunStats":
        if not rows:
            raise ValueError("a run with no step has no statistics")
        skip = warmup if len(rows) > 2 * warmup else 0
        steady = rows[skip:]
        times = [r["step_time_s"] for r in steady]
        median = statistics.median(times)
        spread = 0.0
        if len(times) >= 2 and median > 0:
            q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
            spread = (q3 - q1) / median
        return cls(
            steps=len(rows),
            steady_from=skip + 1,
            step_time_median_s=median,
            step_time_spread=spread,
            tokens_per_s=statistics.median(r["tokens_per_s"] for r in steady),
            mfu=statistics.median(r["mfu"] for r in steady),
            peak_mem_bytes=max(int(r["peak_mem_bytes"]) for r in rows),
            step_times_s=times,
        )

    def measurements(self) -> dict:
        """The flat measurement keys of the run (`steps` is left to the caller's own name)."""
        d = asdict(self)
        d.pop("steps")
        return d


def not_whole(rows: list[dict], planned: int) -> str | None:
    """Why a run that planned `planned` steps did not finish them with a finite loss and grad norm at
    every step, naming the step and the quantity; None when it did."""
    for row in rows:
        for key, what in (("loss", "loss"), ("grad_norm", "grad norm")):
            if not math.isfinite(row[key]):
                return f"the {what} at step {row['step']} is {row[key]!r} ({len(rows)} of {planned} planned steps logged)"
    if len(rows) < planned:
        return f"the run stopped after step {len(rows)} of {planned} planned, every logged value finite"
    return None
