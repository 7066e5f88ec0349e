"""The demo model climbed in two fresh workspaces ends with the same levers, or its ledger says why not.

A keep/choose decision moves a lever only when its interval rules the holder out (issue 33). Two
climbs of one config may still end apart where a comparison was too close to call or could not be
measured: then one of the two ledgers says so for that lever ("indistinguishable" or "not
measured"). A difference that no ledger explains means one climb kept what the other's evidence
contradicts: the flip the decision record exists to prevent. Each climb also stays within twice
the built rungs in attempts (a climb that flips levers between rungs never ends).

The two climbs are the suite's `onboard demo` and a second `onboard demo --no-train` in another
folder, both started in the background at the start of the session (tests/background.py) with the
same timing profile; bench/climb_twice.py's `summarize` and `compare` judge them (the bench itself
climbs two workspaces of any config the same way).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import background
import pytest

from onboard.ladder.table import default_specs
from onboard.ladder.decision import INDISTINGUISHABLE, NOT_MEASURED
from onboard.workspace.layout import Workspace

pytestmark = [pytest.mark.slow]

NAME = "llama3_debug"  # the demo's workspace
_spec = importlib.util.spec_from_file_location("climb_twice", Path(__file__).parents[3] / "bench" / "climb_twice.py")
climb_twice = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(climb_twice)


def climbed(name: str) -> Workspace:
    run, done, _ = background.wait(name)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    return Workspace.load(run.base / name, NAME)


def test_the_demo_model_climbed_twice_ends_with_the_same_levers_or_says_why():
    report = climb_twice.compare([climb_twice.summarize(climbed(name)) for name in ("demo", "twice")])
    print(f"levers that differ between the two climbs: {[(d['key'], d['values']) for d in report['differ']]}")
    bound = 2 * len([s for s in default_specs() if s.built])
    assert report["call_bound"] == bound
    for side in report["sides"]:
        assert side["complete"], side["workspace"]
        assert side["attempts"] <= bound, side["workspace"]
        assert side["levers"], "no lever read from the final recipe"
    for d in report["differ"]:
        assert d["explained_by"], f"{d['key']} ended {d['values']} and neither ledger says the two were not told apart"
        assert {e["verdict"] for e in d["explained_by"]} <= {INDISTINGUISHABLE, NOT_MEASURED}
    assert report["every_difference_explained"] and report["within_call_bound"]


def test_a_difference_no_ledger_explains_is_reported_unexplained():
    """The comparison can fail: a lever that differs while both decisions were clear-cut is unexplained."""
    decided = {"lever": "training.batch_size", "verdict": "faster", "why": "8 beat 4: 1.6x (1.3-1.9)"}
    sides = [{"workspace": w, "attempts": 7, "complete": True, "levers": {"training.batch_size": b},
              "decisions": {"training.batch_size": decided}} for w, b in (("a", 8), ("b", 4))]  # fmt: skip
    report = climb_twice.compare(sides)
    assert [d["key"] for d in report["differ"]] == ["training.batch_size"]
    assert not report["every_difference_explained"]
    sides[1]["decisions"] = {"training.batch_size": {**decided, "verdict": INDISTINGUISHABLE}}
    assert climb_twice.compare(sides)["every_difference_explained"]
