"""A demo whose ladder does not complete is not a passed demo: when every next-step call passes a
rung yet a lever keeps sending the ladder back (two keep rules taking turns), the demo stops at its
call limit, says so, exits 1 and does not train the model with an unproved recipe."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from onboard.cli import demo, demo_train
from onboard.cli.app import app
from onboard.engine.attempt import StepOutcome
from onboard.ladder.table import RUNGS
from onboard.workspace.ledger import Status


def test_a_ladder_that_never_completes_fails_the_demo_and_trains_nothing(tmp_path, monkeypatch):
    calls, trained = [], []

    def passes_forever(ws, **kw):  # kernels passes, its edit sends the ladder back to eager, and so on
        calls.append(1)
        return StepOutcome(ws.name, Status.PASSED, "kernels", len(calls), message="kernels passed", next_rung="eager")

    monkeypatch.setattr(demo, "next_step", passes_forever)
    monkeypatch.setattr(demo_train, "run_train_stage", lambda *a, **k: trained.append(1) or {"exit_code": 0})
    result = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.stderr
    out = json.loads(result.stdout)
    assert out["exit_code"] == 1 and len(calls) == 3 * len(RUNGS) and trained == []
    assert f"did not complete in {3 * len(RUNGS)} next-step calls" in out["steps"][-1]["message"]
