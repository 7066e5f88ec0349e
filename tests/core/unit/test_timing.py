"""The timing protocol on scripted sequences: noise alone never decides, a real difference does."""

from __future__ import annotations

import math
import random
import time

import pytest

from titan_core.measure.timing import TimingProtocol, compare, compare_samples, t_quantile, timed


def _sampler(rng: random.Random, median: float, sigma: float, spikes: float = 0.0):
    """Log-normal step times around `median`; with probability `spikes` a 3x outlier (another job ran)."""

    def sample() -> float:
        t = median * math.exp(rng.gauss(0.0, sigma))
        return t * 3 if rng.random() < spikes else t

    return sample


def _trials(n, *, cand_median, sigma, spikes=0.0, protocol=None):
    outcomes = []
    for seed in range(n):
        rng = random.Random(seed)
        c = compare(_sampler(rng, cand_median, sigma, spikes), _sampler(rng, 0.1, sigma, spikes), protocol)
        outcomes.append(c.outcome)
    return outcomes


def test_t_quantiles_match_the_tables():
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-3)
    assert t_quantile(0.995, 10) == pytest.approx(3.1693, abs=1e-3)
    assert t_quantile(0.975, 200) == pytest.approx(1.9719, abs=1e-3)


def test_identical_distributions_are_indistinguishable_in_at_least_95_of_100():
    outcomes = _trials(100, cand_median=0.1, sigma=0.15)
    assert outcomes.count("indistinguishable") >= 95, outcomes


def test_identical_distributions_with_outliers_are_still_indistinguishable():
    outcomes = _trials(100, cand_median=0.1, sigma=0.1, spikes=0.1)
    assert outcomes.count("indistinguishable") >= 95, outcomes


def test_a_two_times_slower_candidate_is_slower_and_a_faster_one_faster():
    slow = _trials(50, cand_median=0.2, sigma=0.15)
    assert slow.count("slower") == 50, slow
    fast = _trials(50, cand_median=0.05, sigma=0.15)
    assert fast.count("faster") == 50, fast


def test_the_ratio_and_its_interval_cover_the_truth():
    rng = random.Random(7)
    c = compare(_sampler(rng, 0.3, 0.1), _sampler(rng, 0.2, 0.1))
    assert c.outcome == "slower" and c.ci_low <= 1.5 <= c.ci_high and c.ci_low > 1
    assert c.stopped == "interval" and c.rounds >= TimingProtocol().min_rounds
    text = c.describe("A", "B")
    assert "slower" in text and "CI" in text and "rounds" in text


def test_warmup_rounds_are_discarded_and_rounds_interleave():
    order = []

    def a():
        order.append("A")
        return 10.0 if len(order) <= 2 else 1.0  # the first round is a cold start

    def b():
        order.append("B")
        return 1.0

    c = compare(a, b, TimingProtocol(warmup=1, min_rounds=3, max_rounds=3))
    assert order[:6] == ["A", "B", "B", "A", "A", "B"]
    assert c.ratio == pytest.approx(1.0) and c.outcome == "indistinguishable" and c.rounds == 3


def test_a_noisy_pair_stops_at_the_cap_and_decides_nothing_it_cannot_see():
    rng = random.Random(3)
    p = TimingProtocol(max_rounds=8)
    c = compare(_sampler(rng, 0.104, 0.6), _sampler(rng, 0.1, 0.6), p)
    assert c.stopped == "max_rounds" and c.rounds == 8 and c.outcome == "indistinguishable"


def test_the_wall_clock_cap_stops_measuring():
    now = [0.0]

    def clock():
        return now[0]

    def sample():
        now[0] += 1.0
        return 1.0 + 0.5 * (now[0] % 3)

    c = compare(sample, sample, TimingProtocol(max_seconds=10.0), clock=clock)
    assert c.stopped == "max_seconds" and c.rounds <= 6


def test_a_small_real_difference_below_the_minimum_effect_is_indistinguishable():
    rng = random.Random(1)
    p = TimingProtocol(max_rounds=40, ci_half_width=0.002)
    c = compare(_sampler(rng, 0.101, 0.005), _sampler(rng, 0.1, 0.005), p)
    assert c.ci_low > 1 and c.outcome == "indistinguishable"


def test_unpaired_samples_use_the_same_rules():
    rng = random.Random(5)
    fast = [0.1 * math.exp(rng.gauss(0, 0.05)) for _ in range(15)]
    slow = [0.2 * math.exp(rng.gauss(0, 0.05)) for _ in range(15)]
    c = compare_samples(slow, fast)
    assert c.outcome == "slower" and not c.paired and 1.8 < c.ratio < 2.2
    same = compare_samples(fast[:7], fast[7:])
    assert same.outcome == "indistinguishable"
    assert compare_samples([0.1], fast) is None


def test_bad_protocols_and_samples_are_refused():
    with pytest.raises(ValueError, match="min_rounds"):
        TimingProtocol(min_rounds=1)
    with pytest.raises(ValueError, match="unknown timing protocol keys"):
        TimingProtocol.from_dict({"rounds": 3})
    with pytest.raises(ValueError, match="positive"):
        compare(lambda: 0.0, lambda: 1.0, TimingProtocol(warmup=0))


def test_timed_measures_one_call_between_synchronisations():
    calls = []
    sample = timed(lambda: (calls.append("run"), time.sleep(0.02)), sync=lambda: calls.append("sync"))
    t0 = time.perf_counter()
    seconds = sample()
    # at least the 20 ms the call sleeps, and within the wall time around the whole sample
    assert 0.02 <= seconds <= time.perf_counter() - t0 and calls == ["sync", "run", "sync"]
