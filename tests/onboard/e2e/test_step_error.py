"""What the agent sees first: `next-step --json` carries the attempt's error at the top
level (the engine's, or the parity rung's when the port raised), and the skill's summary
script prints it before anything else."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from ladder_fakes import FakeRung, specs

from onboard.ladder.table import RUNGS, RungSpec
from onboard.engine.attempt import StepOutcome
from onboard.engine.next_step import next_step
from onboard.workspace.ledger import Entry, Status
from onboard.workspace.resources import data_dir
from onboard.workspace.layout import Workspace

SCRIPT = data_dir("skills") / "onboard-model" / "scripts" / "summarise_next_step.py"


def summarise(step: dict) -> list[str]:
    spec = importlib.util.spec_from_file_location("summarise_next_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    old, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in the shipped skill
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = old
    return module.summarise(step)


def test_error_a_rung_reports_in_its_details_is_the_top_level_error():
    def failed(details: dict) -> dict:
        entry = Entry(rung="parity", attempt=1, status=Status.FAILED, details=details)
        return StepOutcome("w", Status.FAILED, "parity", 1, entry=entry).to_json()

    port = failed({"error": {"kind": "port", "message": "from_hf failed: KeyError: 'q_proj'"}})
    assert port["error"] == "port error: from_hf failed: KeyError: 'q_proj'"
    assert failed({"error": "test_parity.py wrote no results"})["error"] == "test_parity.py wrote no results"
    assert failed({"error": None})["error"] is None


def test_engine_error_is_the_top_level_error_and_printed_first(debug_ws):
    boom = FakeRung("eager", error=RuntimeError("shape mismatch in layers.0.attention"))
    step = next_step(debug_ws, specs=specs(eager=boom)).to_json()
    assert step["error"].startswith("RuntimeError: shape mismatch in layers.0.attention")
    lines = summarise(step)
    assert lines[0].startswith("error: RuntimeError: shape mismatch") and lines[1].startswith("rung eager, attempt 1")
    assert any(line.startswith("FAILED score_high") for line in lines[2:])


def test_summary_without_error_starts_with_the_rung():
    lines = summarise({"rung": "eager", "attempt": 1, "status": "passed", "error": None, "criteria": []})
    assert lines[0] == "rung eager, attempt 1: passed"


@pytest.mark.hf
@pytest.mark.slow
def test_port_error_in_the_parity_rung_reaches_the_top_level(tmp_path):
    from test_parity_support import add_adapter_methods, new_workspace, tiny_config

    root = new_workspace(tmp_path, "raises", tiny_config("llama"))
    add_adapter_methods(
        root,
        """
def from_hf(self, sd, **kw):
    raise KeyError("model.layers.0.self_attn.q_proj.weight")
""",
    )
    only_parity = [RungSpec(r, "onboard.rungs.parity_rung" if r == "parity" else None) for r in RUNGS]
    outcome = next_step(Workspace.load(tmp_path, "raises"), specs=only_parity)
    step = outcome.to_json()
    assert (outcome.rung, outcome.status) == ("parity", "failed")
    assert step["details"]["error"]["kind"] == "port"
    assert step["error"].startswith("port error: ") and "q_proj" in step["error"]
    lines = summarise(step)
    assert lines[0] == f"error: {step['error']}"
