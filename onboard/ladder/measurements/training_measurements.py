"""What every rung that trains measures of a run: its steady window's speed and memory
(SteadyRun), the same beside the eager rung's evidence (BesideEager), and a run in another
execution mode (ModeRun). Declarations only: the rungs fill them (onboard/rungs/run_compare.py)."""

from __future__ import annotations

from dataclasses import dataclass

from onboard.ladder.contract import ABSENT
from onboard.ladder.gated_runs import GatedRuns


@dataclass(kw_only=True)
class SteadyRun(GatedRuns):
    """The speed and memory of one run's steady window (`run_stats`: titan_core.measure.run_stats.RunStats)."""

    steady_from: int = ABSENT
    """1-based step where the steady window starts (1: the run was too short to leave any out)."""
    step_time_median_s: float = ABSENT
    """Median wall time of one optimizer step over the steady window (seconds)."""
    step_time_spread: float = ABSENT
    """Interquartile range of the steady step times over their median (fraction; 0 with one step)."""
    tokens_per_s: float = ABSENT
    """Median training throughput over the steady window (tokens per second, every data-parallel rank's)."""
    mfu: float = ABSENT
    """Median model FLOPs utilisation over the steady window (fraction of the device's peak; on CPU
    against the best matmul rate seen on this machine: indicative)."""
    peak_mem_bytes: int = ABSENT
    """Most device memory any step reached (bytes)."""
    step_times_s: list[float] = ABSENT
    """The steady window's step times (seconds): what another run's times are compared with."""


@dataclass(kw_only=True)
class BesideEager(SteadyRun):
    """A run's speed and memory beside the eager rung's evidence (`beside_eager`)."""

    eager_step_time_median_s: float | None = ABSENT
    """The eager rung's median step time (seconds); None without eager evidence."""
    eager_peak_mem_bytes: int | None = ABSENT
    """The eager rung's peak memory (bytes); None without eager evidence."""
    speedup_vs_eager: float = ABSENT
    """Eager's median step time over this run's (x; > 1: this run is faster)."""
    vs_eager: dict | None = ABSENT
    """The timing protocol's unpaired comparison of the two step-time samples (ratio, interval,
    outcome: titan_core.measure.timing.Comparison.to_dict); None: eager recorded no step times."""
    vs_eager_text: str = ABSENT
    """`vs_eager` in one line, or why there is no interval."""
    speedup_vs_eager_ci: str | None = ABSENT
    """The speedup with its interval, short (e.g. "1.29x (1.21-1.38)", "~1 (0.93-1.08)")."""
    peak_mem_vs_eager: float = ABSENT
    """This run's peak memory over eager's (x; < 1: it uses less)."""


@dataclass(kw_only=True)
class ModeRun(BesideEager):
    """A run of the recipe in another execution mode (compile, graph_trainer)."""

    moe_experts: str | None = ABSENT
    """The kernels.moe the run used (`capture_moe`); None for a dense model."""
    moe_why: str = ABSENT
    """Why those experts (the recipe's loop syncs the host; or the recipe's choice is kept)."""
    flags: str = ABSENT
    """The `onboard train` flags the run verified, space-separated (e.g. "--compile.enable=true")."""
    compile_time_s: float = ABSENT
    """Seconds spent compiling (and, for the Graph Trainer, tracing and passes), paid on the first step."""
    first_step_time_s: float = ABSENT
    """Wall time of step 1, compile included (seconds)."""
