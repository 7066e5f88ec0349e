"""Timing decisions on a shared machine, on recorded samples (no step is run): a paired interval that
rules out 1 decides whatever the foreign load, which the record keeps beside the figure; two runs timed
apart decide nothing; a rung's protocol carries the checklist's timing budget; a kept thread count
comes with device.adapt_threads."""

from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace

import pytest

from onboard.ladder import decision
from onboard.rungs import timing_profiles
from onboard.rungs.tuning_rung.rung import recipe_edits
from titan_core.config.sections import JobConfig
from titan_core.runtime.cpu_load import LoadSnapshot
from titan_core.measure.timing import compare

# Step times (s) of the demo model's tuning rung with two busy processes on the 2-core machine: two
# OpenMP threads against one, recorded interleaved (one thread: steady; two: each barrier waits for a
# thread the other process holds, 6-65x slower).
ONE_THREAD = [0.112, 0.109, 0.118, 0.111, 0.125, 0.108, 0.115, 0.121]
TWO_THREADS = [1.71, 0.74, 3.95, 2.26, 7.02, 0.69, 2.88, 1.40]


def _busy_probe(foreign: float = 2.0):
    before = LoadSnapshot(wall_s=0.0, busy_s=0.0, cores=2, tick_s=0.01, own_s=0.0, load_1m=3.0)
    after = LoadSnapshot(wall_s=20.0, busy_s=(foreign + 1.0) * 20.0, cores=2, tick_s=0.01, own_s=20.0, load_1m=3.1)
    return iter([before, after]).__next__


def _replay(times):
    it = itertools.cycle(times)
    return lambda: next(it)


def test_a_busy_machine_still_decides_the_thread_count_and_says_its_load():
    proto = timing_profiles.protocol("tuning")
    cmp = compare(_replay(TWO_THREADS), _replay(ONE_THREAD), proto, probe=_busy_probe())
    assert cmp.outcome == "slower" and cmp.load_note.startswith("other processes held 2.00 cores")
    d = decision.decide("tuning", "device.threads", holder=1, candidate=2, comparison=cmp.to_dict())
    assert d.verdict == decision.HELD and d.value == 1 and d.speedup < 1 and d.ci[1] < 1
    assert "timed while other processes held 2.00 cores on average" in d.why
    assert d.load["foreign_cores"] == pytest.approx(2.0) and d.load["load_note"] == cmp.load_note
    # the other way round: one thread against a recipe's two, on the same busy machine, takes the lever
    back = compare(_replay(ONE_THREAD), _replay(TWO_THREADS), proto, probe=_busy_probe())
    kept = decision.decide("tuning", "device.threads", holder=2, candidate=1, comparison=back.to_dict())
    assert kept.verdict == decision.KEPT and kept.value == 1 and kept.ci[0] > 1
    assert back.stopped == "settled" and back.rounds == proto.min_rounds  # settled: no more rounds spent


def test_two_runs_timed_apart_decide_nothing():
    timed_apart = {"outcome": "faster", "ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6, "paired": False,
                   "confidence": 0.99, "rounds": 10}  # fmt: skip
    d = decision.decide("tuning", "device.threads", holder=1, candidate=2, comparison=timed_apart)
    assert d.verdict == decision.NOT_MEASURED and d.value == 1 and d.speedup is None
    assert decision.headline([d.to_dict()]) == "device.threads=2: not measured"


def test_each_timing_rung_has_a_budget_it_says():
    for rung, seconds in (("kernels", 150), ("tuning", 150), ("graph_trainer", 90), ("simple_fsdp", 45)):
        proto = timing_profiles.protocol(rung)
        assert proto.budget_s == seconds and proto.budget is not None
        assert f"{seconds} s of timing in all" in proto.describe_budget()
        assert proto.settings()["budget_s"] == seconds and "budget" not in proto.settings()
    # one protocol object, one clock: a second protocol of the same rung starts its own
    assert timing_profiles.protocol("kernels").budget is not timing_profiles.protocol("kernels").budget


def test_a_kept_thread_count_comes_with_adapt_threads():
    recipe = JobConfig()
    recipe.device.threads = 1
    tuned = copy.deepcopy(recipe)
    tuned.device.threads = 2
    change = {"kept": True, "values": {"device.threads": 2}, "describe": "threads=2 is 1.38x faster", "why": "",
              "step": "flags", "class": "bit_identical"}  # fmt: skip
    edits = {e.key: e for e in recipe_edits(SimpleNamespace(cfg=tuned, changes=[change]), recipe)}
    assert edits["device.threads"].value == 2 and edits["device.adapt_threads"].value is True
    assert "cores free at its start" in edits["device.adapt_threads"].why
    assert all(e.why.startswith("tuning rung (") for e in edits.values())  # the rung's one form, its step named
    # one thread, or a recipe that adapts already: nothing to add
    recipe.device.adapt_threads = tuned.device.adapt_threads = True
    assert "device.adapt_threads" not in {e.key for e in recipe_edits(SimpleNamespace(cfg=tuned, changes=[change]), recipe)}
