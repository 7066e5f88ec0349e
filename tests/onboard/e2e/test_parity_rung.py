"""The parity rung: it runs the workspace's test_parity.py with pytest in a subprocess and
hands the results to the gate, which then fails exactly when the by-hand pytest fails."""

from __future__ import annotations

import pytest
from test_parity_support import add_adapter_methods, new_workspace, tiny_config

from onboard.errors import BadInput
from onboard.ladder.gates import evaluate, load_checklist
from onboard.parity.criteria import asserted_criteria
from onboard.parity.results import read_results
from onboard.rungs import parity_rung as parity
from onboard.ladder.contract import RungContext
from onboard.workspace.layout import Workspace

pytestmark = [pytest.mark.hf, pytest.mark.slow]


def run_rung(base, name):
    ws = Workspace.load(base, name)
    attempt = ws.root / "runs" / "parity" / "attempt-1"
    attempt.mkdir(parents=True)
    lines: list[str] = []
    return parity.run(RungContext(ws, attempt, {}, lines.append)), attempt, lines


def failed_in_gate(result) -> set[str]:
    return {c["name"] for c in evaluate(load_checklist("parity"), result.measurements) if not c["ok"]}


def test_rung_passes_through_the_workspace_test(tmp_path):
    root = new_workspace(tmp_path, "tiny_llama", tiny_config("llama"))
    result, attempt, lines = run_rung(tmp_path, "tiny_llama")
    assert result.measurements["pytest_passed"] is True, (attempt / "pytest.log").read_text()
    assert failed_in_gate(result) == set()
    assert "pytest" in result.command and str(root / "test_parity.py") in result.command
    assert {p.name for p in result.files_read} >= {"recipe.toml", "adapter.py", "config.json", "test_parity.py"}
    # the results the rung reports are the ones the test wrote into the attempt folder
    assert read_results(attempt / "results.json")["measurements"].items() <= result.measurements.items()
    assert "passed" in (attempt / "pytest.log").read_text()
    assert any("parity:" in line for line in lines)


def test_rung_failure_is_the_by_hand_pytest_failure(tmp_path):
    new_workspace(tmp_path, "bad", tiny_config("llama"))
    add_adapter_methods(
        tmp_path / "onboarding" / "bad",
        '''
def from_hf(self, sd, **kw):
    """Port bug: q_proj assumed stored as [in, out]."""
    out = super().from_hf(sd, **kw)
    return {k: (v.t() if k.endswith("attention.wq.weight") else v) for k, v in out.items()}
''',
    )
    result, attempt, _ = run_rung(tmp_path, "bad")
    m = result.measurements
    assert m["pytest_passed"] is False and m["pytest_exit_code"] == 1
    assert m["first_divergence_module"] == "layers.0.attention.wq"
    gate_failed = failed_in_gate(result)
    test_failed = {c.name for c in asserted_criteria() if not c.check(m)[0]}
    assert gate_failed == test_failed | {"pytest_passed"}
    assert {"state_dict_round_trip", "logits_rel_l2"} <= gate_failed
    log = (attempt / "pytest.log").read_text()
    assert "FAILED" in log and "first divergence: layers.0.attention.wq" in log
    assert "layers.0.attention.wq" in result.details["summary"]
    assert "table" not in result.details["localisation"]  # the long table stays in results.json


def test_rung_bad_config_is_bad_input(tmp_path):
    root = new_workspace(tmp_path, "broken", tiny_config("llama"))
    (root / "config.json").write_text("{not json")
    with pytest.raises(BadInput, match="malformed JSON"):
        run_rung(tmp_path, "broken")


def test_rung_without_results_fails_every_criterion(tmp_path, monkeypatch):
    root = new_workspace(tmp_path, "no_results", tiny_config("llama"))
    # an edited test is refused before it runs (tests/onboard/engine/test_forged_evidence.py);
    # here the edit only stands for any test that never gets to write its results
    monkeypatch.setattr(parity, "tamper_problem", lambda ws: None)
    with (root / "test_parity.py").open("a") as f:
        f.write("\ndef broken(:\n")  # an edit that breaks collection: the test never runs
    result, attempt, _ = run_rung(tmp_path, "no_results")
    assert result.measurements["pytest_passed"] is False
    assert failed_in_gate(result) == {c.name for c in load_checklist("parity").criteria}
    assert "SyntaxError" in result.details["pytest_tail"]
