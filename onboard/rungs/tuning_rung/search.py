"""Raise the per-device batch until memory binds or throughput stops improving.

The search doubles the per-device batch, starting from the recipe's. When the user fixed the
global batch, gradient accumulation halves as the batch doubles, so batch x grad_accum (the
rows of one optimizer step) stays what they asked for, and the search ends where grad_accum
would reach below 1. Each larger batch is

1. skipped if the peak memory extrapolated linearly in rows through the last two measured
   batches is over the whole budget: an out-of-memory kills a CPU process, so a batch that
   cannot fit is not run (from one measured batch nothing is extrapolated: the fixed part,
   weights and optimizer state, would be doubled with it);
2. run once to measure its peak memory: over `fraction` x budget, or a `MemoryError` from the
   run (the caller turns its device's out-of-memory error into one), memory binds and the
   previous batch stays;
3. timed against the batch holding the field, per token, by the caller's `compare` (the one
   timing protocol): `faster` takes the field and the search goes on; `slower` or
   `indistinguishable` means throughput stopped improving, and the smaller batch stays;
   `not measured` (no finite interval, the budget spent) decides nothing: it stays too.

The budget is a number the caller passes in (the device's free memory, or a test's), so the
memory stop can be made to bind anywhere. Every batch tried is recorded with its peak memory
and tokens/s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from titan_core.memory.estimate import format_bytes


@dataclass(frozen=True)
class BatchShape:
    batch_size: int
    """Rows per micro-batch on each device."""
    grad_accum: int
    """Micro-batches per optimizer step."""

    @property
    def rows(self) -> int:
        """Rows per optimizer step on one data-parallel rank."""
        return self.batch_size * self.grad_accum

    def label(self) -> str:
        return f"{self.batch_size}x{self.grad_accum}" if self.grad_accum > 1 else str(self.batch_size)


def candidates(start: BatchShape, *, fixed_global: bool, max_doublings: int) -> list[BatchShape]:
    """The larger shapes to try, in order: the batch doubled up to `max_doublings` times; with a
    fixed global batch, grad_accum halved each time and the list ends where it would not divide."""
    out, shape = [], start
    for _ in range(max_doublings):
        if fixed_global:
            if shape.grad_accum % 2:
                break
            shape = BatchShape(shape.batch_size * 2, shape.grad_accum // 2)
        else:
            shape = BatchShape(shape.batch_size * 2, shape.grad_accum)
        out.append(shape)
    return out


@dataclass
class Probe:
    """What one run of a batch shape measured (the caller may attach more in `extra`)."""

    peak_bytes: int
    step_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tried:
    shape: BatchShape
    peak_bytes: int | None
    """Measured peak memory (None: not run, its prediction was over the budget)."""
    tokens_per_s: float | None
    outcome: str
    """start | faster | slower | indistinguishable | not measured | over_memory | predicted_over_memory |
    out_of_memory | rejected."""
    predicted_peak_bytes: int | None = None
    comparison: dict | None = None
    """The timing protocol's answer against the batch that held the field (Comparison.to_dict())."""
    describe: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = {"batch_size": self.shape.batch_size, "grad_accum": self.shape.grad_accum}
        return d


@dataclass
class SearchResult:
    chosen: BatchShape
    start: BatchShape
    tried: list[Tried]
    stopped: str
    """memory | throughput | grid | global_batch | rejected: what ended the search."""
    why: str
    budget_bytes: int
    fraction: float

    @property
    def limit_bytes(self) -> int:
        return int(self.fraction * self.budget_bytes)

    def to_dict(self) -> dict:
        return {
            "chosen": {"batch_size": self.chosen.batch_size, "grad_accum": self.chosen.grad_accum},
            "start": {"batch_size": self.start.batch_size, "grad_accum": self.start.grad_accum},
            "tried": [t.to_dict() for t in self.tried],
            "stopped": self.stopped,
            "why": self.why,
            "budget_bytes": self.budget_bytes,
            "fraction": self.fraction,
            "limit_bytes": self.limit_bytes,
        }


def predicted_peak(tried: list[Tried], shape: BatchShape) -> int | None:
    """Peak memory of `shape` extrapolated linearly in rows per micro-batch through the last two
    measured shapes; None with fewer than two (see the module docstring)."""
    known = [(t.shape.batch_size, t.peak_bytes) for t in tried if t.peak_bytes is not None]
    if len(known) < 2 or known[-1][0] == known[-2][0]:
        return None
    (r0, p0), (r1, p1) = known[-2], known[-1]
    slope = max(0.0, (p1 - p0) / (r1 - r0))
    return int(p1 + slope * (shape.batch_size - r1))


def search(
    start: BatchShape,
    *,
    measure: Callable[[BatchShape], Probe],
    compare: Callable[[BatchShape, BatchShape], Any],
    budget_bytes: int,
    fraction: float,
    max_doublings: int,
    fixed_global: bool,
    tokens_per_row: int,
    reject: Callable[[BatchShape, Probe], str | None] = lambda shape, probe: None,
    grid_end: str = "",
) -> SearchResult:
    """Run the search (module docstring). `measure(shape)` runs one step of that shape (its
    `step_time_s` is the step's seconds); `compare(candidate, holder)` times them with samples of
    seconds per token and returns a titan_core.measure.timing Comparison;
    `reject(shape, probe)` gives a reason to refuse a shape before it is timed (its numerics), else None;
    `grid_end` says what bounds `max_doublings`, for the message when the search reaches it."""
    if not 0 < fraction <= 1 or budget_bytes <= 0:
        raise ValueError(f"batch search needs 0 < fraction <= 1 and a positive budget, got {fraction}, {budget_bytes}")
    limit = int(fraction * budget_bytes)
    first = measure(start)
    first_tps = start.rows * tokens_per_row / first.step_time_s
    tried = [Tried(start, first.peak_bytes, first_tps, "start", extra=first.extra)]

    def done(stopped: str, why: str, chosen: BatchShape) -> SearchResult:
        return SearchResult(chosen, start, tried, stopped, why, budget_bytes, fraction)

    if first.peak_bytes > limit:
        return done(
            "memory",
            f"the recipe's batch {start.label()} already peaks at "
            f"{format_bytes(first.peak_bytes)}, over {fraction:.0%} of the "
            f"{format_bytes(budget_bytes)} budget: not raised",
            start,
        )
    shapes = candidates(start, fixed_global=fixed_global, max_doublings=max_doublings)
    if not shapes and fixed_global and max_doublings > 0:
        return done(
            "global_batch",
            f"grad_accum {start.grad_accum} cannot be halved: the fixed global batch of "
            f"{start.rows} rows leaves no larger per-device batch",
            start,
        )
    if not shapes:
        return done(
            "grid",
            f"batch {start.label()} is already at the grid's end{grid_end and ' (' + grid_end + ')'}: not raised",
            start,
        )
    holder = start
    for shape in shapes:
        guess = predicted_peak(tried, shape)
        if guess is not None and guess > budget_bytes:
            tried.append(Tried(shape, None, None, "predicted_over_memory", predicted_peak_bytes=guess))
            return done(
                "memory",
                f"batch {shape.label()} would peak near {format_bytes(guess)} (extrapolated), "
                f"over the {format_bytes(budget_bytes)} budget: not run; {holder.label()} stays",
                holder,
            )
        try:
            probe = measure(shape)
        except MemoryError as e:
            tried.append(Tried(shape, None, None, "out_of_memory", predicted_peak_bytes=guess, describe=str(e)))
            return done("memory", f"batch {shape.label()} ran out of memory ({e}): {holder.label()} stays", holder)
        if probe.peak_bytes > limit:
            tried.append(
                Tried(shape, probe.peak_bytes, None, "over_memory", predicted_peak_bytes=guess, extra=probe.extra)
            )
            why = (
                f"batch {shape.label()} peaked at {format_bytes(probe.peak_bytes)}, over {fraction:.0%} of the "
                f"{format_bytes(budget_bytes)} budget ({format_bytes(limit)}): {holder.label()} stays"
            )
            return done("memory", why, holder)
        refused = reject(shape, probe)
        if refused:
            tried.append(Tried(shape, probe.peak_bytes, None, "rejected", predicted_peak_bytes=guess, describe=refused,
                               extra=probe.extra))  # fmt: skip
            return done("rejected", f"batch {shape.label()} rejected: {refused}; {holder.label()} stays", holder)
        cmp = compare(shape, holder)
        tps = 1 / cmp.candidate_median_s  # the samples are seconds per token
        held = next(t for t in tried if t.shape == holder)  # its tokens/s from the same interleaved rounds
        held.tokens_per_s = 1 / cmp.baseline_median_s
        line = cmp.describe(f"batch {shape.label()}", f"batch {holder.label()}") + " (time per token)"
        tried.append(Tried(shape, probe.peak_bytes, tps, cmp.outcome, predicted_peak_bytes=guess,
                           comparison=cmp.to_dict(), describe=line, extra=probe.extra))  # fmt: skip
        if cmp.outcome != "faster":
            said = "no figure could decide" if cmp.outcome == "not measured" else "throughput stopped improving"
            return done("throughput", f"{said}: {line}; {holder.label()} stays", holder)
        holder = shape
    end = grid_end or f"{max_doublings} doublings"
    return done(
        "grid",
        f"every batch up to {holder.label()} (the grid's end: {end}) was faster per token and within the memory limit",
        holder,
    )
