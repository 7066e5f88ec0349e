"""Two climbs of one model end with the same levers, or a ledger says why: the decision rule on recorded
step times, not a second whole climb.

What the suite once proved with a second `onboard demo` beside the first (bench/climb_twice.py still
climbs two workspaces for real): a keep/choose decision moves a lever only when its interval rules the
holder out, so two climbs that time the same levers differ only where one of them found the two sides
"indistinguishable" or "not measured" (issue 33). Here each "climb" replays the same recorded rounds
in its own order (a climb's rounds meet the machine's noise in their own order) through the rungs'
own timing protocol and `decision.decide`, and bench/climb_twice.py's `compare` judges the two.
The recordings span the cases that matter: a clear win (batch 8 per token), a close call (bf16
parameters at one thread with other processes busy) and a clear loss on a busy machine (two threads).
"""

from __future__ import annotations

import importlib.util
import itertools
import random
from pathlib import Path

import pytest
from test_decisions_under_load import ONE_THREAD, TWO_THREADS

from onboard.ladder import decision
from onboard.rungs import timing_profiles
from titan_core.measure.timing import compare

_spec = importlib.util.spec_from_file_location("climb_twice", Path(__file__).parents[3] / "bench" / "climb_twice.py")
climb_twice = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(climb_twice)

# Whole training steps (s) of the demo model (llama3 debugmodel, batch 4 x 128, one thread), holder and
# candidate interleaved in one process, recorded on the 2-core machine while other test processes ran.
# Batch 8's steps are per token (halved): what the tuning rung compares.
RECORDED = {
    "training.mixed_precision_param": ("float32", "bfloat16", {
        "holder": [0.6132, 0.6603, 0.5569, 0.5983, 0.6821, 0.606, 0.562, 0.6146, 0.6112, 0.577, 0.6161, 0.7018,
                   0.5598, 0.6442, 0.5559, 0.5081, 0.5751, 0.6105, 0.5743, 0.5555, 0.576, 0.5847, 0.6662, 0.5883],
        "candidate": [0.6584, 0.6145, 0.5936, 0.7304, 0.6317, 0.6006, 0.6482, 0.5087, 0.5855, 0.5868, 0.5924,
                      0.7223, 0.6812, 0.6679, 0.5834, 0.5729, 0.6247, 0.5732, 0.617, 0.637, 0.5785, 0.5878, 0.6048,
                      0.59]}),
    "training.batch_size": (4, 8, {
        "holder": [0.8315, 0.8283, 0.7939, 0.789, 0.7738, 0.8364, 0.7611, 0.9587, 0.8063, 0.824, 1.0352, 0.8224,
                   0.939, 0.7661, 0.7344, 0.7489, 0.8531, 0.8032, 0.8198, 0.9631, 0.8174, 1.2404, 1.0461, 1.0141],
        "candidate": [0.6988, 0.7581, 0.7128, 0.771, 0.7742, 0.7003, 0.6448, 0.7778, 0.7362, 0.6636, 0.8013,
                      0.7341, 0.7983, 0.7452, 0.7181, 0.6272, 0.7488, 0.7422, 0.7227, 0.8724, 0.6692, 0.726,
                      0.8827, 0.9402]}),
    "device.threads": (1, 2, {"holder": ONE_THREAD * 3, "candidate": TWO_THREADS * 3}),
}  # fmt: skip


def _replay(times: list[float]):
    it = itertools.cycle(times)
    return lambda: next(it)


def climb(seed: int, name: str) -> dict:
    """One climb's summary (bench/climb_twice.py `summarize`'s shape): each lever decided on the
    recorded rounds in this climb's own order, the value the recipe ends with."""
    rng = random.Random(seed)
    levers, decisions = {}, {}
    for lever, (holder, candidate, rounds) in RECORDED.items():
        order = list(range(len(rounds["holder"])))
        rng.shuffle(order)  # a pair stays a pair: both sides of a round shared the machine's moment
        cmp = compare(_replay([rounds["candidate"][i] for i in order]), _replay([rounds["holder"][i] for i in order]),
                      timing_profiles.protocol("tuning"))  # fmt: skip
        d = decision.decide("tuning", lever, holder=holder, candidate=candidate, comparison=cmp.to_dict())
        levers[lever], decisions[lever] = d.value, d.to_dict()
    return {"workspace": name, "attempts": 7, "complete": True, "levers": levers, "decisions": decisions}


@pytest.mark.parametrize("seeds", [(0, 1), (2, 3), (4, 5), (6, 7)])
def test_two_climbs_on_recorded_rounds_end_with_the_same_levers_or_say_why(seeds):
    sides = [climb(seed, f"climb-{seed}") for seed in seeds]
    report = climb_twice.compare(sides)
    for d in report["differ"]:
        assert d["explained_by"], f"{d['key']} ended {d['values']} and neither climb says the two were not told apart"
        assert {e["verdict"] for e in d["explained_by"]} <= {decision.INDISTINGUISHABLE, decision.NOT_MEASURED}
    assert report["every_difference_explained"]
    for side in sides:  # the clear cases decide the same way in every order
        assert side["decisions"]["training.batch_size"]["verdict"] == decision.KEPT, side["decisions"]
        assert side["decisions"]["device.threads"]["verdict"] == decision.HELD, side["decisions"]
        assert side["decisions"]["training.mixed_precision_param"]["verdict"] != decision.KEPT or (
            side["decisions"]["training.mixed_precision_param"]["ci"][0] > 1)


def test_a_difference_no_ledger_explains_is_reported_unexplained():
    """The comparison can fail: a lever that differs while both decisions were clear-cut is unexplained."""
    decided = {"lever": "training.batch_size", "verdict": "faster", "why": "8 beat 4: 1.6x (1.3-1.9)"}
    sides = [{"workspace": w, "attempts": 7, "complete": True, "levers": {"training.batch_size": b},
              "decisions": {"training.batch_size": decided}} for w, b in (("a", 8), ("b", 4))]  # fmt: skip
    report = climb_twice.compare(sides)
    assert [d["key"] for d in report["differ"]] == ["training.batch_size"]
    assert not report["every_difference_explained"]
    sides[1]["decisions"] = {"training.batch_size": {**decided, "verdict": decision.INDISTINGUISHABLE}}
    assert climb_twice.compare(sides)["every_difference_explained"]
