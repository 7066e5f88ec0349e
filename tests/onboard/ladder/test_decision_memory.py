"""The memory rule of a keep/choose decision (onboard.ladder.decision.decide_memory): a margin either
side of the threshold so a figure at the edge cannot flip between attempts, a saving exactly at the
edge counts as reaching it, and a peak that was not measured never decides."""

from __future__ import annotations

import pytest

from onboard.ladder.decision import HELD, KEPT, NOT_MEASURED, decide_memory


def rule(peak_holder, peak_candidate, *, earned=False):
    return decide_memory("kernels", "kernels.loss", holder="plain", candidate="fused_ce", peak_holder=peak_holder,
                         peak_candidate=peak_candidate, min_saving=0.10, margin=0.02, holder_earned=earned)  # fmt: skip


def test_a_saving_exactly_at_the_edge_keeps_the_candidate():
    # 1 - 88/100 is 0.12000000000000000 in decimal but 0.1 + 0.02 is 0.12000000000000001 in floats
    d = rule(100, 88)
    assert (d.verdict, d.value) == (KEPT, "fused_ce")
    assert d.memory_saving == pytest.approx(0.12)


def test_a_saving_inside_the_margin_leaves_the_holder():
    d = rule(1000, 890)  # 11%: above the threshold, under threshold + margin
    assert (d.verdict, d.value) == (HELD, "plain")
    assert "needs >= 12%" in d.why


def test_an_earned_holder_is_dropped_only_once_it_saves_less_than_threshold_minus_margin():
    # the holder (fused_ce) was kept for memory; the candidate is the plain path it replaced
    assert rule(1000, 1090, earned=True).verdict == HELD  # the holder still saves ~9%: it stands
    assert rule(1000, 1080, earned=True).verdict == HELD  # 8%, exactly the lower edge: it stands
    d = rule(1000, 1070, earned=True)  # 7%: under 10% - 2%, the plain path returns
    assert (d.verdict, d.value) == (KEPT, "fused_ce")
    assert d.memory_saving == pytest.approx(-0.07)


@pytest.mark.parametrize("holder,candidate", [(None, 100), (0, 100), (100, None)])
def test_a_peak_not_measured_never_decides(holder, candidate):
    d = rule(holder, candidate)
    assert (d.verdict, d.value, d.memory_saving) == (NOT_MEASURED, "plain", None)
