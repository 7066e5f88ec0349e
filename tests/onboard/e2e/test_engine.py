"""The ladder engine with fake rungs: evidence entries, gate verdicts, staleness, waivers,
interrupted and withdrawn attempts, and the end of the built ladder."""

import json
import re
from pathlib import Path

import pytest
from ladder_fakes import FakeRung, specs

from onboard.errors import BadInput
from onboard.ladder.gates import parse_checklist
from onboard.workspace.fsutil import sha256_file
from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.workspace.ledger import Ledger
from onboard.workspace.lock import WorkspaceLock
from onboard.workspace.layout import Workspace


def reload(ws):
    return Workspace.load(ws.root.parent.parent, ws.name)


def ledger_json(ws):
    return json.loads((ws.root / "ladder.json").read_text())


def statuses(ws, sp):
    return {s.rung: s.status for s in ladder_states(reload(ws), sp)}


def test_passing_attempt_records_full_evidence(debug_ws):
    sp = specs()
    outcome = next_step(debug_ws, specs=sp)
    assert (outcome.status, outcome.rung, outcome.attempt, outcome.exit_code) == ("passed", "eager", 1, 0)
    assert outcome.next_rung == "parity"
    [entry] = ledger_json(debug_ws)["attempts"]
    assert entry["status"] == "passed" and entry["attempt"] == 1 and entry["command"] == "fake eager"
    assert entry["started"] < entry["ended"]
    env = entry["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["python"]
    assert set(entry["files_read"]) == {"recipe.toml"}
    assert entry["files_read"]["recipe.toml"] == sha256_file(debug_ws.root / "recipe.toml")
    assert entry["measurements"] == {"score": 2.0, "flag": True, "diff": 0.5}
    assert [(c["name"], c["ok"], c["waived"]) for c in entry["criteria"]] == [
        ("score_high", True, False),
        ("flag_set", True, False),
    ]
    assert (debug_ws.root / entry["attempt_dir"] / "log.txt").is_file()
    assert entry["attempt_dir"] == "runs/eager/attempt-1"


def test_failed_gate_exit_1_and_retry_gets_next_attempt(debug_ws):
    bad = FakeRung("eager", {"score": 0.5, "flag": True})
    outcome = next_step(debug_ws, specs=specs(eager=bad))
    assert (outcome.status, outcome.exit_code) == ("failed", 1)
    assert outcome.to_json()["failed"] == ["score_high"]
    assert outcome.to_json()["hints"] == {"score_high": "score too low"}
    assert statuses(debug_ws, specs(eager=bad))["eager"] == "failed"
    again = next_step(reload(debug_ws), specs=specs())  # the fix landed; same rung, attempt 2
    assert (again.rung, again.attempt, again.status) == ("eager", 2, "passed")


def test_evidence_of_passed_rungs_reaches_later_rungs_and_thresholds(debug_ws):
    parity = FakeRung("parity", {"diff": 1.5})
    sp = specs(eager=FakeRung("eager", {"score": 2.0, "flag": True}), parity=parity)
    next_step(debug_ws, specs=sp)
    outcome = next_step(reload(debug_ws), specs=sp)
    assert outcome.rung == "parity" and outcome.status == "passed"  # 1.5 <= evidence.eager.score = 2.0
    assert parity.contexts[0].evidence == {"eager": {"score": 2.0, "flag": True}}
    assert outcome.criteria[0]["threshold"] == 2.0


def test_end_of_built_ladder_says_so_and_later_rungs_are_not_built(debug_ws):
    sp = specs()
    next_step(debug_ws, specs=sp)
    next_step(reload(debug_ws), specs=sp)
    done = next_step(reload(debug_ws), specs=sp)
    assert (done.status, done.exit_code) == ("complete", 0)
    assert done.message == "ladder complete up to the last rung that exists: parity"
    st = statuses(debug_ws, sp)
    assert st["simple_fsdp"] == st["tuning"] == "not built yet"
    assert "skipped" not in json.dumps(ledger_json(debug_ws))


def test_not_applicable_is_recorded_with_reason_and_advances(debug_ws):
    na = FakeRung("eager", {}, not_applicable="the MoE kernel on a dense model")
    outcome = next_step(debug_ws, specs=specs(eager=na))
    assert (outcome.status, outcome.exit_code, outcome.next_rung) == ("not_applicable", 0, "parity")
    entry = ledger_json(debug_ws)["attempts"][0]
    assert entry["not_applicable_reason"] == "the MoE kernel on a dense model" and entry["criteria"] == []


def test_rung_crash_is_a_failed_attempt_with_error_and_unmeasured_criteria(debug_ws):
    boom = FakeRung("eager", error=RuntimeError("shape mismatch in layers.0.attention"))
    outcome = next_step(debug_ws, specs=specs(eager=boom))
    assert (outcome.status, outcome.exit_code) == ("failed", 1)
    entry = ledger_json(debug_ws)["attempts"][0]
    assert entry["error"].startswith("RuntimeError: shape mismatch")
    assert all(c["hint"].startswith("rung did not measure") for c in entry["criteria"])
    assert "shape mismatch" in (debug_ws.root / "runs/eager/attempt-1/error.txt").read_text()


def test_bad_input_from_a_rung_withdraws_the_attempt(debug_ws):
    before = (debug_ws.root / "ladder.json").read_text()
    bad = FakeRung("eager", error=BadInput("recipe.toml: unknown key 'training.stepz'"))
    with pytest.raises(BadInput, match="stepz"):
        next_step(debug_ws, specs=specs(eager=bad))
    assert (debug_ws.root / "ladder.json").read_text() == before
    assert not (debug_ws.root / "runs").exists()
    assert not (debug_ws.root / ".onboard.lock").exists()


def test_keyboard_interrupt_is_recorded_and_ledger_stays_valid(debug_ws):
    ctrl_c = FakeRung("eager", error=KeyboardInterrupt())
    outcome = next_step(debug_ws, specs=specs(eager=ctrl_c))
    assert (outcome.status, outcome.exit_code) == ("interrupted", 130)
    [entry] = ledger_json(debug_ws)["attempts"]
    assert entry["status"] == "interrupted" and entry["ended"] and "KeyboardInterrupt" in entry["error"]
    assert statuses(debug_ws, specs())["eager"] == "interrupted"
    retry = next_step(reload(debug_ws), specs=specs())
    assert (retry.rung, retry.attempt, retry.status) == ("eager", 2, "passed")


def test_editing_a_file_a_rung_read_makes_it_stale_and_next_step_reverifies(debug_ws):
    sp = specs()
    next_step(debug_ws, specs=sp)
    next_step(reload(debug_ws), specs=sp)
    assert statuses(debug_ws, sp)["eager"] == "passed"
    recipe = debug_ws.root / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("seed = 0", "seed = 1"))
    states = {s.rung: s for s in ladder_states(reload(debug_ws), sp)}
    assert states["eager"].status == "stale" and "recipe.toml" in states["eager"].reason
    outcome = next_step(reload(debug_ws), specs=sp)
    assert (outcome.rung, outcome.attempt, outcome.status) == ("eager", 2, "passed")
    assert "recipe.toml" in outcome.entry["rerun_reason"]
    # parity read recipe.toml too; and eager was re-verified after it passed: either way stale
    assert statuses(debug_ws, sp)["parity"] == "stale"
    assert next_step(reload(debug_ws), specs=sp).rung == "parity"
    assert statuses(debug_ws, sp)["parity"] == "passed"


def test_reverifying_an_earlier_rung_makes_later_passes_stale(debug_ws):
    sp = specs(
        eager=FakeRung("eager", {"score": 2.0, "flag": True}, files=("config.json",)),
        parity=FakeRung("parity", {"diff": 0.1}, files=("adapter.py",)),
    )
    next_step(debug_ws, specs=sp)
    next_step(reload(debug_ws), specs=sp)
    cfg = debug_ws.root / "config.json"
    cfg.write_text(cfg.read_text() + "\n")  # only eager read it
    st = statuses(debug_ws, sp)
    assert (st["eager"], st["parity"]) == ("stale", "passed")
    next_step(reload(debug_ws), specs=sp)
    states = {s.rung: s for s in ladder_states(reload(debug_ws), sp)}
    assert states["parity"].status == "stale" and "eager re-verified" in states["parity"].reason


def test_a_rung_that_reads_no_evidence_stands_when_an_earlier_rung_re_verifies(debug_ws):
    """Parity's declaration (it reads upstream's numbers, no rung's): it is given no evidence, and eager's
    re-verification leaves it passed; a rung that reads eager's evidence is given it and goes stale."""
    sp = specs(
        eager=FakeRung("eager", {"score": 2.0, "flag": True}, files=("config.json",)),
        parity=FakeRung("parity", {"diff": 0.1}, files=("adapter.py",), reads_evidence=frozenset()),
    )
    own_bound = [{"name": "diff_small", "metric": "diff", "comparator": "<=", "threshold": 1.0, "hint": "diff"}]
    sp[1].checklist = parse_checklist({"rung": "parity", "title": "fake parity", "criteria": own_bound}, "fake parity")
    next_step(debug_ws, specs=sp)
    next_step(reload(debug_ws), specs=sp)
    assert sp[1].module.contexts[-1].evidence == {}  # eager had passed: not given to a rung that declares none
    cfg = debug_ws.root / "config.json"
    cfg.write_text(cfg.read_text() + "\n")
    assert next_step(reload(debug_ws), specs=sp).rung == "eager"
    st = statuses(debug_ws, sp)
    assert (st["eager"], st["parity"]) == ("passed", "passed")
    reading = specs(eager=sp[0].module, parity=FakeRung("parity", {"diff": 0.1}, files=("adapter.py",),
                                                        reads_evidence=frozenset({"eager"})))  # fmt: skip
    reading[1].checklist = sp[1].checklist
    assert statuses(debug_ws, reading)["parity"] == "stale"
    assert next_step(reload(debug_ws), specs=reading).rung == "parity"
    assert set(reading[1].module.contexts[-1].evidence) == {"eager"}


def test_every_checklist_reads_only_the_evidence_its_rung_declares():
    """A bound taken from another rung's evidence (`evidence.<rung>.<name>` in checklists/) must name a rung
    the table says the rung reads: that is all its gate is given."""
    from onboard.ladder.table import RUNGS, TABLE, RungSpec

    root = Path(__file__).resolve().parents[3] / "checklists"
    for rung in RUNGS:
        named = set(re.findall(r"evidence\.(\w+)\.", (root / f"{rung}.yaml").read_text()))
        spec = RungSpec(rung, TABLE[rung].runner)
        assert all(spec.reads_evidence_of(r) for r in named), (rung, named, TABLE[rung].reads_evidence)
    assert TABLE["parity"].reads_evidence == frozenset()


def test_waiver_counts_as_ok_but_waived_on_the_next_attempt(debug_ws):
    low = FakeRung("eager", {"score": 0.5, "flag": True})
    assert next_step(debug_ws, specs=specs(eager=low)).status == "failed"
    ledger = Ledger.load(debug_ws.root / "ladder.json")
    ledger.add_waiver("eager", "score_high", "score is capped on this toy")
    ledger.save()
    outcome = next_step(reload(debug_ws), specs=specs(eager=low))
    assert outcome.status == "passed"
    c = outcome.criteria[0]
    assert (c["name"], c["ok"], c["raw_ok"], c["waived"], c["why"]) == (
        "score_high", True, False, True, "score is capped on this toy")  # fmt: skip
    assert outcome.to_json()["waived"] == ["score_high"]


def test_a_live_lock_refuses_a_second_run(debug_ws):
    with WorkspaceLock(debug_ws.root):
        with pytest.raises(BadInput, match=r"another onboard run \(pid \d+\) holds"):
            next_step(reload(debug_ws), specs=specs())
    assert ledger_json(debug_ws)["attempts"] == []
