"""The batch step of the tuning rung (onboard.rungs.tuning_rung.search): it stops at the right batch
and says why when the memory budget binds (measured, or predicted before running out of memory),
when throughput stops improving, at the grid's end, and it keeps the global batch when the user
fixed one. Peaks are scripted (a fixed part plus a part per row) and every timing goes through the
one timing protocol (`compare` on scripted samples), so the edges are exact."""

from __future__ import annotations

import pytest

from titan_core.measure.timing import TimingProtocol, compare
from onboard.rungs.tuning_rung.search import BatchShape, Probe, candidates, predicted_peak, search

MIB = 2**20
PROTOCOL = TimingProtocol(warmup=0, min_rounds=2, max_rounds=4)
FIXED, PER_ROW = 300 * MIB, 10 * MIB  # the scripted peak: weights etc., then activations per row


def peak(shape: BatchShape) -> int:
    return FIXED + PER_ROW * shape.batch_size


def run(start=BatchShape(4, 1), *, budget, per_token=None, fixed_global=False, doublings=3, reject=None):
    """The search with scripted peaks and per-token times ({batch_size: seconds per token}, default: each
    doubling 20% faster per token); returns (result, the shapes measured)."""
    per_token = per_token or {4: 1.0, 8: 0.8, 16: 0.64, 32: 0.51, 64: 0.41}
    measured = []

    def measure(shape):
        measured.append(shape)
        return Probe(peak(shape), per_token[shape.batch_size] * shape.rows * 128)

    def timed(candidate, holder):
        return compare(lambda: per_token[candidate.batch_size], lambda: per_token[holder.batch_size], PROTOCOL)

    extra = {"reject": reject} if reject else {}
    result = search(start, measure=measure, compare=timed, budget_bytes=budget, fraction=0.9, max_doublings=doublings,
                    fixed_global=fixed_global, tokens_per_row=128, **extra)  # fmt: skip
    return result, measured


def test_a_budget_that_binds_stops_at_the_last_batch_under_it():
    # limit = 0.9 x 500 MiB = 450 MiB: batch 8 (380 MiB) fits, batch 16 (460 MiB) does not
    result, measured = run(budget=500 * MIB)
    assert result.chosen == BatchShape(8, 1) and result.stopped == "memory"
    assert [t.shape.batch_size for t in result.tried] == [4, 8, 16]
    over = result.tried[-1]
    assert over.outcome == "over_memory" and over.peak_bytes == peak(BatchShape(16, 1)) and over.tokens_per_s is None
    assert "batch 16 peaked at 460 MiB, over 90% of the 500 MiB budget (450 MiB): 8 stays" == result.why
    assert result.limit_bytes == int(0.9 * 500 * MIB)
    # every batch that ran has its peak and tokens/s; the ones that fit were timed against the holder
    assert all(t.peak_bytes for t in result.tried)
    assert result.tried[1].outcome == "faster" and result.tried[1].comparison["outcome"] == "faster"
    assert result.tried[0].tokens_per_s == pytest.approx(1 / 1.0)
    assert result.tried[1].tokens_per_s == pytest.approx(1 / 0.8)


def test_a_batch_predicted_over_the_whole_budget_is_not_run():
    # measured 340 MiB (4) and 380 MiB (8, within 0.9 x 450 = 405): 16 extrapolates to 460 MiB,
    # over the whole 450 MiB budget
    result, measured = run(budget=450 * MIB)
    assert result.chosen == BatchShape(8, 1) and result.stopped == "memory"
    assert BatchShape(16, 1) not in measured
    last = result.tried[-1]
    assert last.outcome == "predicted_over_memory" and last.peak_bytes is None
    assert last.predicted_peak_bytes == peak(BatchShape(16, 1))  # linear through the two measured peaks
    assert result.why.startswith("batch 16 would peak near 460 MiB (extrapolated), over the 450 MiB budget: not run")


def test_the_recipe_batch_already_over_the_limit_is_not_raised():
    result, measured = run(budget=300 * MIB)
    assert result.chosen == BatchShape(4, 1) and measured == [BatchShape(4, 1)]
    assert result.stopped == "memory" and "already peaks at 340 MiB" in result.why and "not raised" in result.why


def test_throughput_that_stops_improving_keeps_the_smaller_batch():
    result, _ = run(budget=10_000 * MIB, per_token={4: 1.0, 8: 0.8, 16: 0.8})
    assert result.chosen == BatchShape(8, 1) and result.stopped == "throughput"
    assert result.tried[-1].outcome == "indistinguishable"
    assert result.why.startswith("throughput stopped improving: batch 16 and batch 8 are indistinguishable")


def test_the_grid_end_says_so():
    result, _ = run(budget=10_000 * MIB, doublings=2)
    assert (
        result.chosen == BatchShape(16, 1) and result.stopped == "grid" and "the grid's end: 2 doublings" in result.why
    )
    at_end, measured = run(BatchShape(16, 1), budget=10_000 * MIB, doublings=0)
    assert at_end.chosen == BatchShape(16, 1) and at_end.stopped == "grid" and measured == [BatchShape(16, 1)]
    assert "already at the grid's end" in at_end.why and "not raised" in at_end.why


def test_a_fixed_global_batch_trades_accumulation_for_batch():
    assert candidates(BatchShape(2, 8), fixed_global=True, max_doublings=5) == [
        BatchShape(4, 4),
        BatchShape(8, 2),
        BatchShape(16, 1),
    ]
    assert candidates(BatchShape(4, 3), fixed_global=True, max_doublings=3) == []
    assert candidates(BatchShape(4, 2), fixed_global=False, max_doublings=2) == [BatchShape(8, 2), BatchShape(16, 2)]
    result, measured = run(BatchShape(4, 4), budget=10_000 * MIB, fixed_global=True)
    assert {s.rows for s in measured} == {16} and result.chosen == BatchShape(16, 1) and result.stopped == "grid"
    odd, _ = run(BatchShape(4, 3), budget=10_000 * MIB, fixed_global=True)
    assert odd.stopped == "global_batch" and odd.chosen == BatchShape(4, 3)


def test_a_rejected_batch_stops_the_search_with_its_reason():
    result, _ = run(budget=10_000 * MIB, reject=lambda shape, probe: "diverged" if shape.batch_size == 16 else None)
    assert result.chosen == BatchShape(8, 1) and result.stopped == "rejected"
    assert result.tried[-1].outcome == "rejected" and "batch 16 rejected: diverged" in result.why


def test_nothing_is_extrapolated_from_one_batch():
    from onboard.rungs.tuning_rung.search import Tried

    # weights and optimizer state dominate: doubling the whole peak would stop a batch that fits
    one = [Tried(BatchShape(4, 1), 400, None, "start")]
    assert predicted_peak(one, BatchShape(8, 1)) is None
    two = one + [Tried(BatchShape(8, 1), 440, None, "faster")]
    assert predicted_peak(two, BatchShape(16, 1)) == 520


def test_an_out_of_memory_error_is_memory_binding():
    def measure(shape):
        if shape.batch_size > 4:
            raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return Probe(100 * MIB, 1.0)

    result = search(BatchShape(4, 1), measure=measure, compare=None, budget_bytes=10_000 * MIB, fraction=0.9,
                    max_doublings=2, fixed_global=False, tokens_per_row=128)  # fmt: skip
    assert result.chosen == BatchShape(4, 1) and result.stopped == "memory"
    assert result.tried[-1].outcome == "out_of_memory" and "ran out of memory (CUDA out of memory" in result.why
