"""Evidence that cannot be forged by editing ladder.json (or test_parity.py).

Each test forges what a person or an agent could write by hand, then checks that `onboard
status --json` shows the rung invalid with its reason and that next-step runs that gate again:
a not_applicable entry its rung's own rule does not back, a passed entry no run of this
workspace recorded, an edited test_parity.py, and the workspace's family and an entry's times.
The engine's own attempts use fake rungs (tests/onboard/e2e/ladder_fakes.py); only the parity
rung is the real one, where its template check is what is tested (it refuses before pytest runs).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.ladder.states import entry_error
from onboard.ladder.table import RungSpec
from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.workspace.ledger import RUN_RECORD, Entry, Ledger
from onboard.parity.results import written_by_this_run
from onboard.ladder.template_check import TEST_FILE, expected_text, tamper_problem
from onboard.workspace.layout import Workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace
from test_cli import LLAMA
from attempt_folders import write_attempt_folder


def _ladder_fakes():
    """tests/onboard/e2e/ladder_fakes.py, under the name the ladder tests import it by."""
    if "ladder_fakes" not in sys.modules:
        path = Path(__file__).parents[1] / "e2e" / "ladder_fakes.py"
        spec = importlib.util.spec_from_file_location("ladder_fakes", path)
        sys.modules["ladder_fakes"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["ladder_fakes"]


fakes = _ladder_fakes()
FakeRung, specs = fakes.FakeRung, fakes.specs
REPORT_LADDER = json.loads((Path(__file__).parent.parent / "report" / "report_ladder.json").read_text())
PAST = {"started": "2026-01-01T00:00:00+00:00", "ended": "2026-01-01T00:00:05+00:00"}


@pytest.fixture
def ws(tmp_path) -> Workspace:
    write_workspace(plan_workspace("m", tmp_path, preset="llama3/debugmodel", device="cpu"))
    return Workspace.load(tmp_path, "m")


def reload(ws: Workspace) -> Workspace:
    return Workspace.load(ws.root.parent.parent, ws.name)


def tamper(ws: Workspace, edit) -> None:
    """Apply `edit(data)` to ladder.json on disk, as a hand edit would."""
    path = ws.root / "ladder.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def status_json(ws: Workspace) -> dict:
    result = CliRunner().invoke(app, ["status", ws.name, "--dir", str(ws.root.parent.parent), "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def rung_row(status: dict, rung: str) -> dict:
    return next(r for r in status["rungs"] if r["rung"] == rung)


def states(ws: Workspace, sp) -> dict:
    return {s.rung: s for s in ladder_states(reload(ws), sp)}


def eager_entry(**fields) -> dict:
    return {"rung": "eager", "attempt": 1, "files_read": {}, "criteria": [], **PAST, **fields}


# ---- (a) not_applicable only where the rung's own rule says so ------------------------------------
def test_forged_not_applicable_entry_is_invalid_and_next_step_reruns_the_gate(ws):
    na = eager_entry(status="not_applicable", not_applicable_reason="a dense model has no experts")
    tamper(ws, lambda d: d["attempts"].append(na))
    status = status_json(ws)  # the real eager rung: it has no not-applicable rule at all
    eager = rung_row(status, "eager")
    assert (eager["status"], eager["recorded_status"]) == ("invalid", "not_applicable")
    assert "the eager rung has no not-applicable rule" in eager["reason"]
    assert (status["current_rung"], status["message"]) == ("eager", "next: re-run eager")
    sp = specs()  # a rung with a rule that says it applies here
    state = states(ws, sp)["eager"]
    assert state.status == "invalid" and "own not-applicable rule says it applies" in state.reason
    rerun = next_step(reload(ws), specs=sp)
    assert (rerun.rung, rerun.attempt, rerun.status) == ("eager", 2, "passed")
    assert "rule says it applies" in rerun.entry.rerun_reason
    assert states(ws, sp)["eager"].status == "passed"


def test_a_rung_saying_not_applicable_against_its_own_rule_fails_the_attempt(ws):
    class Disagrees(FakeRung):
        def run(self, ctx):
            result = super().run(ctx)  # its rule (not_applicable=None) says it applies
            result.not_applicable = "the MoE kernel on a dense model"
            return result

    outcome = next_step(ws, specs=specs(eager=Disagrees("eager", {"score": 2.0, "flag": True})))
    assert outcome.status == "failed"
    assert "returned not_applicable (the MoE kernel on a dense model)" in entry_error(outcome.entry)
    assert "rule says it applies" in entry_error(outcome.entry)


# ---- (b) passed only with the run folder's own record ------------------------------------------
def test_forged_passed_entry_without_a_run_folder_is_invalid_and_rerun(ws):
    measurements = {"all_finite": True, "step1_loss": 7.6, "last_loss": 7.0, "step1_loss_rel_to_expected": 0.1,
                    "step1_loss_vs_transformers_rel_err": 0.0, "full_model_built_on_meta": True, "runs_whole": True,
                    "full_model_key_mismatches": 0, "full_model_checkpoint_problems": 0}  # fmt: skip
    forged = eager_entry(status="passed", attempt_dir="runs/eager/attempt-1", measurements=measurements)
    tamper(ws, lambda d: d["attempts"].append(forged))
    status = status_json(ws)  # the shipped eager checklist: every criterion holds, the folder does not exist
    eager = rung_row(status, "eager")
    assert (eager["status"], eager["failed_criteria"]) == ("invalid", [])
    assert f"{ws.root / 'runs/eager/attempt-1' / RUN_RECORD} is missing" in eager["reason"]
    assert status["current_rung"] == "eager" and status["message"] == "next: re-run eager"
    sp = specs()
    tamper(ws, lambda d: d["attempts"][0].update(measurements={"score": 2.0, "flag": True}))
    assert states(ws, sp)["eager"].status == "invalid"
    rerun = next_step(reload(ws), specs=sp)
    assert (rerun.attempt, rerun.status) == (2, "passed") and "is missing" in rerun.entry.rerun_reason
    record = json.loads((ws.root / "runs/eager/attempt-2" / RUN_RECORD).read_text())
    assert record["measurements"] == rerun.entry.measurements == {"score": 2.0, "flag": True, "diff": 0.5}
    assert record["started"] == rerun.entry.started
    assert states(ws, sp)["eager"].status == "passed"


def test_a_passed_entry_must_say_what_its_own_run_folder_says(ws):
    sp = specs()
    next_step(ws, specs=sp)  # eager attempt 1 passes with score 2.0
    tamper(ws, lambda d: d["attempts"][0]["measurements"].update(score=3.0))  # still above 1.0
    eager = states(ws, sp)["eager"]
    assert eager.status == "invalid"
    assert "measurements (score: 3.0 in ladder.json, 2.0 in the run folder)" in eager.reason
    # another folder's record (another workspace's, an older attempt's) is not this attempt's
    tamper(ws, lambda d: d["attempts"][0]["measurements"].update(score=2.0))
    assert states(ws, sp)["eager"].status == "passed"
    other = reload(ws).root.parent / "elsewhere"
    other.mkdir()
    tamper(ws, lambda d: d["attempts"][0].update(attempt_dir=str(other)))
    assert "not runs/eager/attempt-1" in states(ws, sp)["eager"].reason
    tamper(ws, lambda d: d["attempts"][0].update(attempt_dir="runs/eager/attempt-1"))
    folder = ws.root / "runs/eager/attempt-1"
    (other / RUN_RECORD).write_text((folder / RUN_RECORD).read_text())
    shutil.rmtree(folder)
    folder.symlink_to(other)
    assert "links outside the workspace" in states(ws, sp)["eager"].reason


# ---- (c) test_parity.py is the generated one -----------------------------------------------------
def parity_specs():
    """A fake eager rung and the real parity rung (the rest not built)."""
    sp = specs(built=("eager",))
    return [RungSpec("parity", "onboard.rungs.parity_rung") if s.name == "parity" else s for s in sp]


def forge_parity_pass(ws: Workspace) -> None:
    """A passed parity entry with the demo's real measurements and its run folder, as a run writes them."""
    demo = next(e for e in REPORT_LADDER["attempts"] if e["rung"] == "parity")
    eager_ended = ws.ledger.entries("eager")[-1].ended
    entry = Entry(rung="parity", attempt=1, status="passed", started=eager_ended, ended=eager_ended,
                  attempt_dir="runs/parity/attempt-1", measurements=demo["measurements"],
                  files_read=ws.hashes(["recipe.toml", "adapter.py", "test_parity.py", "config.json"]))  # fmt: skip
    forged = write_attempt_folder(ws, entry.to_dict())
    tamper(ws, lambda d: d["attempts"].append(forged))


def test_tampered_test_parity_is_invalid_in_status_and_the_rerun_refuses_it(ws):
    sp = parity_specs()
    assert next_step(ws, specs=sp).status == "passed"  # the fake eager rung
    forge_parity_pass(reload(ws))
    assert states(ws, sp)["parity"].status == "passed"  # a pass that holds, until the test is edited
    test_file = ws.root / TEST_FILE
    test_file.write_text(test_file.read_text() + "\nimport shutil  # copies another workspace's results.json\n")
    parity = rung_row(status_json(ws), "parity")
    assert (parity["status"], parity["recorded_status"]) == ("invalid", "passed")
    assert f"{test_file} differs from the template" in parity["reason"] and "--force` or restore it" in parity["reason"]
    rerun = next_step(reload(ws), specs=sp)  # the real parity rung: refused before pytest starts
    assert (rerun.rung, rerun.attempt, rerun.status) == ("parity", 2, "failed")
    assert "differs from the template" in entry_error(rerun.entry)
    assert not (ws.root / "runs/parity/attempt-2/pytest.log").exists()
    test_file.write_text(expected_text(reload(ws)))  # restored: the same bytes new-model wrote
    assert tamper_problem(reload(ws)) is None


def test_the_parity_result_file_must_be_this_runs_own(tmp_path):
    attempt, other = tmp_path / "attempt-1", tmp_path / "other"
    attempt.mkdir()
    other.mkdir()
    since = time.time()
    (other / "results.json").write_text("{}")
    out = attempt / "results.json"
    out.write_text("{}")
    assert written_by_this_run(out, attempt, since) is None
    os.utime(out, (since - 3600, since - 3600))  # a copy that kept its time (cp -p, shutil.copy2)
    assert "before this attempt's test started" in written_by_this_run(out, attempt, since)
    out.unlink()
    out.symlink_to(other / "results.json")
    assert "is a link to" in written_by_this_run(out, attempt, since)
    out.unlink()
    os.link(other / "results.json", out)
    assert "hard link" in written_by_this_run(out, attempt, since)
    assert "outside this attempt's folder" in written_by_this_run(other / "results.json", attempt, since)


@pytest.mark.parametrize("how", ["hf_config", "flux"])  # (a port differs in one docstring line; its plan is slow)
def test_the_template_renders_again_to_what_new_model_wrote(tmp_path, how):
    if how == "flux":  # the diffusion branch of the template
        plan = plan_workspace("w", tmp_path, preset="flux/debugmodel", device="cpu")
    else:
        config = tmp_path / "config.json"
        config.write_text(json.dumps(LLAMA))
        plan = plan_workspace("w", tmp_path, hf_config=config, device="cpu")
    write_workspace(plan)
    assert tamper_problem(Workspace.load(tmp_path, "w")) is None


# ---- (d) what ladder.json says about the workspace and the times -----------------------------------
def test_forged_family_and_model_type_are_not_believed(ws):
    tamper(ws, lambda d: d["workspace"].update(family="qwen3", model_type="qwen3"))
    status = status_json(ws)
    assert (status["family"], status["model_type"]) == ("llama3", "llama")  # recipe.toml, config.json
    assert status["ledger_mismatches"] == [
        "ladder.json's workspace block says family 'qwen3', but recipe.toml [model] family is 'llama3'",
        "ladder.json's workspace block says model_type 'qwen3', but config.json model_type is 'llama'",
    ]
    text = CliRunner().invoke(app, ["status", ws.name, "--dir", str(ws.root.parent.parent)], env={"COLUMNS": "300"})
    assert "m: llama (native path, family llama3" in text.stdout and "says family 'qwen3'" in text.stdout


def test_forged_times_are_not_believed(ws):
    sp = specs()
    next_step(ws, specs=sp)
    entry = reload(ws).ledger.entries("eager")[0]
    tamper(ws, lambda d: d["attempts"][0].update(duration_s=86400.0))
    assert Ledger.load(ws.root / "ladder.json").entries("eager")[0].duration_s == entry.duration_s < 60
    tamper(ws, lambda d: d["attempts"][0].update(ended="2026-01-01T00:00:00+00:00"))
    eager = states(ws, sp)["eager"]
    assert eager.status == "invalid"
    assert f"ended (2026-01-01T00:00:00+00:00) before it started ({entry.started})" in eager.reason
    future = {"started": "2099-01-01T00:00:00+00:00", "ended": "2099-01-01T00:00:05+00:00"}
    tamper(ws, lambda d: d["attempts"][0].update(future))
    eager = states(ws, sp)["eager"]
    assert eager.status == "invalid" and "2099-01-01T00:00:05+00:00 lies in the future" in eager.reason
    assert next_step(reload(ws), specs=sp).attempt == 2  # re-run
