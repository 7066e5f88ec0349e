"""What a timing comparison (titan_core.measure.timing.Comparison, or its to_dict) must satisfy
whatever the machine measured: a test cannot know whether a kernel is faster on a busy CI host,
but it can know the outcome follows from the interval. Shared by the tests that get a comparison
from a real run (tests/ is on the path: its conftest.py)."""

from __future__ import annotations

import math


def expected_outcome(ratio: float, ci_low: float, ci_high: float, min_effect: float) -> str:
    """The protocol's rule, restated: `faster` iff the interval lies below 1 and the ratio is at
    least `min_effect` beyond it, `slower` the mirror image, else `indistinguishable`."""
    margin = math.log1p(min_effect)
    if ci_low > 1 and math.log(ratio) >= margin:
        return "slower"
    if ci_high < 1 and math.log(ratio) <= -margin:
        return "faster"
    return "indistinguishable"


def check_comparison(c, min_effect: float) -> None:
    """AssertionError unless `c` (a Comparison or its dict) is self-consistent under `min_effect`."""
    c = c if isinstance(c, dict) else c.to_dict()
    if c["outcome"] == "not measured":  # no finite interval, no rounds, no budget left: it must say which
        assert isinstance(c.get("not_measured_why"), str) and c["not_measured_why"], c
        return
    assert c["ci_low"] <= c["ratio"] <= c["ci_high"], c
    want = expected_outcome(c["ratio"], c["ci_low"], c["ci_high"], min_effect)
    assert c["outcome"] == want, (
        f"outcome {c['outcome']!r}, but ratio {c['ratio']:.4g} in [{c['ci_low']:.4g}, {c['ci_high']:.4g}] "
        f"with min_effect {min_effect} means {want!r}"
    )
    if "speedup" in c:  # to_dict's; a Comparison read back from a ledger may predate it
        assert c["speedup"] == 1 / c["ratio"], c
