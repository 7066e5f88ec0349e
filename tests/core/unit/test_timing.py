"""The timing protocol on scripted sequences: noise alone never decides, a real difference does."""

from __future__ import annotations

import dataclasses
import math
import random
import time

import pytest

from titan_core.measure.timing import TimingProtocol, compare, t_quantile, timed


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
    # a 1.5x difference is settled at the first round a decision may rest on
    assert c.stopped == "settled" and c.rounds == TimingProtocol().min_rounds
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


def test_a_noisy_pair_stops_once_no_outcome_is_reachable_and_decides_nothing():
    rng = random.Random(3)
    p = TimingProtocol(max_rounds=40)
    c = compare(_sampler(rng, 0.104, 0.6), _sampler(rng, 0.1, 0.6), p)
    # 60% noise on a 4% difference: 40 rounds could not exclude 1, so it stops long before them
    assert c.stopped == "unreachable" and c.rounds < 20 and c.outcome == "indistinguishable"
    assert "stopped: unreachable" in c.describe()


def test_a_noisy_pair_whose_outcome_is_in_reach_runs_on_to_the_cap():
    rng = random.Random(3)
    p = TimingProtocol(min_rounds=4, max_rounds=8, ci_half_width=0.001)
    c = compare(_sampler(rng, 0.13, 0.08), _sampler(rng, 0.1, 0.08), p)
    assert c.stopped in ("settled", "max_rounds") and c.rounds >= 4
    if c.stopped == "max_rounds":
        assert c.rounds == 8


def test_a_real_difference_stops_as_soon_as_settled():
    now = [0.0]
    rng = random.Random(11)

    def sampler(mean):
        def sample():
            now[0] += mean
            return mean * math.exp(rng.gauss(0, 0.03))

        return sample

    c = compare(sampler(0.2), sampler(0.1), TimingProtocol(min_rounds=4, max_rounds=40), clock=lambda: now[0])
    assert c.outcome == "slower" and c.stopped == "settled" and c.rounds == 4
    # a benchmark, whose figure is the answer, goes on until the interval is narrow
    bench = TimingProtocol(min_rounds=4, max_rounds=40, ci_half_width=0.01, stop_when_settled=False)
    c = compare(sampler(0.2), sampler(0.1), bench, clock=lambda: now[0])
    assert c.outcome == "slower" and c.stopped in ("interval", "max_rounds") and c.rounds > 4
    assert c.stopped == "max_rounds" or c.ci_high / c.ci_low <= 1.01**2


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
    p = TimingProtocol(min_rounds=30, max_rounds=40, ci_half_width=0.002)
    c = compare(_sampler(rng, 0.101, 0.005), _sampler(rng, 0.1, 0.005), p)
    assert c.ci_low > 1 and c.outcome == "indistinguishable"
    # with the stopping rules free to look early, it stops once no settled outcome is in reach
    early = compare(_sampler(rng, 0.101, 0.005), _sampler(rng, 0.1, 0.005), TimingProtocol(ci_half_width=0.002))
    assert early.outcome == "indistinguishable" and early.stopped == "unreachable" and early.rounds < 40


def test_a_budget_bounds_every_comparison_of_one_protocol_together():
    now = [0.0]

    def sample():
        now[0] += 1.0
        return 1.0 + 0.5 * (now[0] % 3)

    p = TimingProtocol(max_seconds=100.0, budget_s=15.0)
    first = compare(sample, sample, p, clock=lambda: now[0])
    assert first.stopped == "budget" and now[0] >= 15.0
    second = compare(sample, sample, dataclasses.replace(p, max_rounds=30), clock=lambda: now[0])
    assert second.outcome == "not measured" and second.rounds == 0 and second.stopped == "budget"
    assert second.not_measured_why == "the timing budget of 15 s was spent before this comparison began"
    assert "decides nothing" not in second.describe() and second.short().startswith("not measured (the timing budget")
    assert "15 s of timing in all" in p.describe_budget()
    with pytest.raises(ValueError, match="budget_s > 0"):
        TimingProtocol(budget_s=0)


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
