"""The ledger is evidence, not a claim: a tampered ladder.json never reads as passed.

Each test edits ladder.json by hand the way a person (or an agent) could, then checks that
status, the report and next-step re-evaluate the entry against its checklist."""

import json

from ladder_fakes import FakeRung, specs

from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.workspace.ledger import Ledger
from onboard.report.write import write_report
from onboard.ladder.states import ladder_message
from onboard.cli.views import state_dict
from onboard.workspace.layout import Workspace


def reload(ws):
    return Workspace.load(ws.root.parent.parent, ws.name)


def tamper(ws, edit):
    """Apply `edit(data)` to ladder.json on disk, as a hand edit would."""
    path = ws.root / "ladder.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def states(ws, sp):
    return {s.rung: s for s in ladder_states(reload(ws), sp)}


def eager_section(report: str) -> str:
    return report.split("## eager:", 1)[1].split("\n## ", 1)[0]


def test_failed_entry_edited_to_passed_is_invalid_everywhere_and_rerun(debug_ws):
    low = FakeRung("eager", {"score": 0.5, "flag": True})
    assert next_step(debug_ws, specs=specs(eager=low)).status == "failed"
    tamper(debug_ws, lambda d: d["attempts"][0].update(status="passed"))
    sp = specs()
    eager = states(debug_ws, sp)["eager"]
    assert eager.status == "invalid"
    assert "score_high: score = 0.5, needs >= 1.0" in eager.reason
    row = state_dict(eager)
    assert row["failed_criteria"] == ["score_high"] and row["recorded_status"] == "passed"
    assert [(c["name"], c["value"], c["threshold"]) for c in row["invalid_criteria"]] == [("score_high", 0.5, 1.0)]
    assert ladder_message(list(states(debug_ws, sp).values())) == "next: re-run eager"
    report = write_report(reload(debug_ws), sp).read_text()
    assert "| 1 | eager | **invalid** |" in report
    section = eager_section(report)
    assert section.startswith(" invalid") and "**passed**" not in section
    assert "ladder.json says passed" in section and "❌ **FAIL**" in section
    rerun = next_step(reload(debug_ws), specs=sp)
    assert (rerun.rung, rerun.attempt, rerun.status) == ("eager", 2, "passed")
    assert states(debug_ws, sp)["eager"].status == "passed"


def test_passed_entry_with_its_measurements_removed_is_invalid(debug_ws):
    sp = specs()
    next_step(debug_ws, specs=sp)
    tamper(debug_ws, lambda d: d["attempts"][0].update(measurements={}))
    eager = states(debug_ws, sp)["eager"]
    assert eager.status == "invalid" and "records no measurements" in eager.reason
    assert state_dict(eager)["failed_criteria"] == ["score_high", "flag_set"]
    assert next_step(reload(debug_ws), specs=sp).rung == "eager"


def test_added_entry_with_no_measurements_is_invalid(debug_ws):
    def add(d):
        d["attempts"].append({"rung": "eager", "attempt": 1, "status": "passed", "started": "2026-01-01T00:00:00+00:00",
                              "ended": "2026-01-01T00:00:01+00:00", "files_read": {}, "criteria": []})  # fmt: skip

    tamper(debug_ws, add)
    eager = states(debug_ws, specs())["eager"]
    assert eager.status == "invalid" and "no measurements" in eager.reason


def test_measurement_edited_past_its_threshold_is_invalid_naming_the_criterion(debug_ws):
    sp = specs()
    next_step(debug_ws, specs=sp)
    assert states(debug_ws, sp)["eager"].status == "passed"
    tamper(debug_ws, lambda d: d["attempts"][0]["measurements"].update(score=0.9))
    eager = states(debug_ws, sp)["eager"]
    assert eager.status == "invalid" and "score_high: score = 0.9, needs >= 1.0" in eager.reason
    assert "flag_set" not in eager.reason  # only the criterion that fails is named


def test_recorded_criteria_marked_ok_do_not_count(debug_ws):
    low = FakeRung("eager", {"score": 0.5, "flag": True})
    next_step(debug_ws, specs=specs(eager=low))

    def forge(d):
        entry = d["attempts"][0]
        entry["status"] = "passed"
        for c in entry["criteria"]:
            c["ok"] = c["raw_ok"] = True

    tamper(debug_ws, forge)
    assert states(debug_ws, specs())["eager"].status == "invalid"


def test_waiver_on_record_keeps_a_criterion_ok(debug_ws):
    low = FakeRung("eager", {"score": 0.5, "flag": True})
    ledger = Ledger.load(debug_ws.root / "ladder.json")
    ledger.add_waiver("eager", "score_high", "score is capped on this toy")
    ledger.save()
    assert next_step(reload(debug_ws), specs=specs(eager=low)).status == "passed"
    eager = states(debug_ws, specs())["eager"]
    assert eager.status == "passed" and state_dict(eager)["waived_criteria"] == ["score_high"]


def test_waiver_recorded_after_a_failed_attempt_does_not_make_it_passed(debug_ws):
    low = FakeRung("eager", {"score": 0.5, "flag": True})
    assert next_step(debug_ws, specs=specs(eager=low)).status == "failed"
    ledger = Ledger.load(debug_ws.root / "ladder.json")
    ledger.add_waiver("eager", "score_high", "added after the attempt")
    ledger.save()
    tamper(debug_ws, lambda d: d["attempts"][0].update(status="passed"))
    eager = states(debug_ws, specs())["eager"]
    assert eager.status == "invalid" and "score_high" in eager.reason


def test_threshold_references_use_the_evidence_as_it_was(debug_ws):
    def sp(score):
        return specs(
            eager=FakeRung("eager", {"score": score, "flag": True}, files=("config.json",)),
            parity=FakeRung("parity", {"diff": 1.5}, files=("adapter.py",)),
        )

    next_step(debug_ws, specs=sp(2.0))
    next_step(reload(debug_ws), specs=sp(2.0))
    assert states(debug_ws, sp(2.0))["parity"].status == "passed"  # 1.5 <= evidence.eager.score = 2.0
    # eager re-verifies with a lower score: parity is stale, not invalid, because it is judged
    # against the eager entry that existed when it ran (2.0), not the newer one (1.2)
    cfg = debug_ws.root / "config.json"
    cfg.write_text(cfg.read_text() + "\n")
    assert next_step(reload(debug_ws), specs=sp(1.2)).attempt == 2
    parity = states(debug_ws, sp(1.2))["parity"]
    assert parity.status == "stale" and "eager re-verified" in parity.reason
    # a parity measurement edited past the evidence it was judged against is invalid
    tamper(debug_ws, lambda d: [e for e in d["attempts"] if e["rung"] == "parity"][0]["measurements"].update(diff=2.5))
    parity = states(debug_ws, sp(1.2))["parity"]
    assert parity.status == "invalid"
    assert "diff_small: diff = 2.5, needs <= 2.0 (evidence.eager.score)" in parity.reason


def test_not_applicable_needs_a_reason_and_no_criteria(debug_ws):
    sp = specs(eager=FakeRung("eager", {}, not_applicable="the MoE kernel on a dense model"))
    next_step(debug_ws, specs=sp)
    assert states(debug_ws, sp)["eager"].status == "not_applicable"
    tamper(debug_ws, lambda d: d["attempts"][0].update(not_applicable_reason=" "))
    eager = states(debug_ws, sp)["eager"]
    assert eager.status == "invalid" and "no reason" in eager.reason
    crit = {"name": "score_high", "ok": True}
    tamper(debug_ws, lambda d: d["attempts"][0].update(not_applicable_reason="dense", criteria=[crit]))
    eager = states(debug_ws, sp)["eager"]
    assert eager.status == "invalid" and "records criteria" in eager.reason


def test_passed_entry_that_records_an_error_is_invalid(debug_ws):
    sp = specs()
    next_step(debug_ws, specs=sp)
    tamper(debug_ws, lambda d: d["attempts"][0].update(error="RuntimeError: boom"))
    eager = states(debug_ws, sp)["eager"]
    assert eager.status == "invalid" and "RuntimeError: boom" in eager.reason


def test_status_and_report_commands_recheck_against_the_shipped_checklist(tmp_path):
    from typer.testing import CliRunner

    from onboard.cli.app import app

    def onboard(*args):
        return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})

    assert onboard("new-model", "m", "--preset", "llama3/debugmodel", "--dir", tmp_path).exit_code == 0
    ws = Workspace.load(tmp_path, "m")
    forged = {"rung": "eager", "attempt": 1, "status": "passed", "started": "2026-01-01T00:00:00+00:00",
              "ended": "2026-01-01T00:00:05+00:00", "files_read": {}, "criteria": [],
              "measurements": {"all_finite": True, "step1_loss": 7.6, "last_loss": 7.0,
                               "step1_loss_rel_to_expected": 0.4, "step1_loss_vs_transformers_rel_err": 0.0,
                               "full_model_built_on_meta": True,
                               "full_model_key_mismatches": 0, "full_model_checkpoint_problems": 0,
                               "runs_whole": True}}  # fmt: skip
    tamper(ws, lambda d: d["attempts"].append(forged))
    status = onboard("status", "m", "--dir", tmp_path, "--json")
    assert status.exit_code == 0
    eager = json.loads(status.stdout)["rungs"][0]
    assert (eager["status"], eager["recorded_status"]) == ("invalid", "passed")
    assert [c["name"] for c in eager["invalid_criteria"]] == ["step1_loss_near_expected"]
    assert eager["invalid_criteria"][0]["value"] == 0.4 and eager["invalid_criteria"][0]["threshold"] == 0.25
    assert json.loads(status.stdout)["current_rung"] == "eager"
    text = onboard("status", "m", "--dir", tmp_path).stdout
    assert "invalid" in text and "step1_loss_near_expected" in text
    assert onboard("report", "m", "--dir", tmp_path).exit_code == 0
    report = (ws.root / "REPORT.md").read_text()
    assert "| 1 | eager | **invalid** |" in report and "step1_loss_rel_to_expected = 0.4, needs <= 0.25" in report
