"""The tests' own helpers: hang guards that scale with the load (tests/hang_guard.py) and the
consistency check of a timing comparison (tests/timing_checks.py)."""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys

import pytest
from hang_guard import CAP, HangGuard, Load, hang_guard, stretch
from timing_checks import check_comparison, expected_outcome

from titan_core.measure.timing import TimingProtocol, _outcome, compare


@pytest.mark.parametrize("load, factor", [
    (Load(0.3, 2), 1.0),  # idle: the base, never less
    (Load(2.0, 2), 1.0),
    (Load(6.0, 2), 3.0),
    (Load(8.0, 2), 4.0),  # the demo's machine: 600 s -> 2400 s, past the 1,669 s it took
    (Load(64.0, 2), CAP),
    (Load(8.0, 16), 1.0),
])  # fmt: skip
def test_the_timeout_scales_with_load_per_core(load, factor):
    assert stretch(load) == factor
    assert HangGuard("x", 600, load).timeout_s == 600 * factor


def test_the_message_states_the_load_at_start_and_end():
    guard = HangGuard("onboard demo", 600, Load(8.0, 2))
    text = guard.message(end=Load(7.5, 2))
    assert text.startswith("onboard demo: no result within 2400 s (hang guard 600 s x 4.00 for the load)")
    assert "load average 8.0 on 2 cores at start, load average 7.5 on 2 cores at end (a loaded machine" in text
    assert "loaded machine" not in HangGuard("idle", 60, Load(0.5, 2)).message(end=Load(0.5, 2))


def test_a_guard_that_fires_fails_the_test_with_the_load():
    with pytest.raises(pytest.fail.Exception, match=r"sleeper: no result within .* at start, load average .* at end"):
        with hang_guard(0.2, "sleeper") as guard:
            subprocess.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=guard.timeout_s)


def test_a_launch_guard_fails_only_when_it_fired():
    guard = HangGuard("2 ranks", 300, Load(1.0, 2))
    guard.fail_if(False, "not reached")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)2 ranks: no result within 300 s.*\nrank 0 still running"):
        guard.fail_if(True, "rank 0 still running")


def test_the_restated_outcome_rule_is_the_protocols():
    for mean, lo_off, hi_off, effect in itertools.product(
        [-0.3, -0.05, -0.01, 0.0, 0.01, 0.05, 0.3], [0.001, 0.02, 0.2], [0.001, 0.02, 0.2], [0.02, 0.1]
    ):
        lo, hi = mean - lo_off, mean + hi_off
        want = _outcome(mean, lo, hi, TimingProtocol(min_effect=effect))
        assert expected_outcome(math.exp(mean), math.exp(lo), math.exp(hi), effect) == want, (mean, lo, hi, effect)


def test_check_comparison_accepts_a_true_answer_and_refuses_a_wrong_one():
    rng = random.Random(3)
    cmp = compare(lambda: 0.2 * math.exp(rng.gauss(0, 0.02)), lambda: 0.1 * math.exp(rng.gauss(0, 0.02)))
    assert cmp.outcome == "slower"
    check_comparison(cmp, TimingProtocol().min_effect)
    for wrong in ({"outcome": "faster"}, {"outcome": "indistinguishable"}, {"ratio": cmp.ci_high * 1.1}):
        with pytest.raises(AssertionError):
            check_comparison({**cmp.to_dict(), **wrong}, TimingProtocol().min_effect)
