"""The ONBOARD_* variables (onboard/environment.py): read once as a command starts; the parity gate passes
its child only what the workspace says (its results file, its recorded weights) and records, in the
ledger entry's details.environment, what it passed and which inherited value it left out; a by-hand
run of test_parity.py records the override it ran with in results.json.

The child (pytest on test_parity.py) is replaced by a stand-in that writes results.json the way the
real test does, under the environment the rung gave it: the test is about what reaches the child."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from onboard.engine.attempt import AttemptInputs, run_attempt
from onboard.ladder.gates import load_checklist
from onboard.workspace.ledger import Ledger
from onboard.environment import child_env, command_scope, inherited
from onboard.parity.results import RESULTS_ENV, WEIGHTS_ENV, read_results, write_results
from onboard.rungs import parity_rung
from onboard.workspace.layout import Workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace

STALE = "/left/in/the/shell/weights"


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Workspace:
    for name in list(os.environ):  # whatever the machine's shell holds is not this test's
        if name.startswith("ONBOARD_") or name in parity_rung.PYTEST_STEERING:
            monkeypatch.delenv(name)
    write_workspace(plan_workspace("m", tmp_path, preset="llama3/debugmodel", device="cpu"))
    return Workspace.load(tmp_path, "m")


@pytest.fixture
def child(monkeypatch) -> list[dict]:
    """The environments the parity rung started its child with; the child writes results as the real
    test does (write_results in its own process, whose environment is exactly the one it was given)."""
    seen: list[dict] = []
    real_run = subprocess.run

    def fake_run(cmd, *args, env=None, **kw):
        if RESULTS_ENV not in (env or {}):  # another caller of subprocess.run (the module is shared)
            return real_run(cmd, *args, env=env, **kw)
        seen.append(dict(env))
        with mock.patch.dict(os.environ, env, clear=True):
            write_results(Path(env[RESULTS_ENV]), {"measurements": {}, "error": None})
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(parity_rung.subprocess, "run", fake_run)
    return seen


def _attempt(ws: Workspace, lines: list[str]) -> dict:
    """One parity attempt through the engine, as next-step runs it; the entry as ladder.json holds it."""
    ledger = Ledger.load(ws.ledger.path)
    run_attempt(AttemptInputs(ws=ws, ledger=ledger, rung="parity", module=parity_rung,
                              checklist=load_checklist("parity"), rerun_reason=None, evidence={},
                              log=lines.append, base_command="onboard next-step m"))  # fmt: skip
    return Ledger.load(ws.ledger.path).entries("parity")[-1].to_dict()


def test_an_inherited_weights_variable_steers_nothing_and_is_on_the_record(ws, child, monkeypatch):
    monkeypatch.setenv(WEIGHTS_ENV, STALE)
    lines: list[str] = []
    entry = _attempt(ws, lines)
    env = child[0]
    assert WEIGHTS_ENV not in env  # the workspace has no weights: the test compares seeded ones
    results_file = env[RESULTS_ENV]
    assert Path(results_file).parent == ws.root / "runs" / "parity" / "attempt-1"
    assert entry["details"]["environment"] == {"passed": {RESULTS_ENV: results_file}, "ignored": {WEIGHTS_ENV: STALE}}
    assert any(f"{WEIGHTS_ENV}={STALE} in the environment is not passed to test_parity.py" in line for line in lines)
    # what the child itself recorded: only what the rung passed
    assert read_results(Path(results_file))["environment"] == {"overrides": {RESULTS_ENV: results_file}}

    monkeypatch.delenv(WEIGHTS_ENV)  # a later run, the variable gone: nothing of it anywhere
    entry = _attempt(ws, lines)
    assert WEIGHTS_ENV not in child[1]
    assert entry["details"]["environment"]["ignored"] == {}


def test_the_workspace_weights_reach_the_test_whatever_the_shell_says(ws, child, monkeypatch):
    recorded = ws.root / "recorded_weights"
    monkeypatch.setattr(Workspace, "weights_dir", property(lambda self: recorded))
    monkeypatch.setattr(Workspace, "weight_files", lambda self: [])
    monkeypatch.setattr(parity_rung, "tamper_problem", lambda ws: None)  # test_parity.py was rendered without them
    monkeypatch.setenv(WEIGHTS_ENV, STALE)
    monkeypatch.setenv(RESULTS_ENV, "/somewhere/else/results.json")  # plumbing: the rung's own always wins
    entry = _attempt(ws, [])
    assert child[0][WEIGHTS_ENV] == str(recorded)
    assert child[0][RESULTS_ENV].endswith("attempt-1/results.json")
    assert entry["details"]["environment"]["ignored"] == {
        RESULTS_ENV: "/somewhere/else/results.json", WEIGHTS_ENV: STALE,
    }  # fmt: skip


def test_a_by_hand_run_records_the_override_it_used(tmp_path, monkeypatch):
    monkeypatch.setenv(WEIGHTS_ENV, "/my/other/weights")
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    write_results(tmp_path / "results.json", {"measurements": {}})
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["environment"]["overrides"][WEIGHTS_ENV] == "/my/other/weights"


def test_a_command_reads_the_variables_once_and_children_get_none_it_did_not_pass(monkeypatch):
    monkeypatch.setenv("ONBOARD_SOMETHING", "at start")
    with command_scope():
        monkeypatch.setenv("ONBOARD_SOMETHING", "changed mid-command")
        monkeypatch.setenv("ONBOARD_LATER", "set mid-command")
        assert inherited()["ONBOARD_SOMETHING"] == "at start" and "ONBOARD_LATER" not in inherited()
        env = child_env({"ONBOARD_PASSED": "x"}, OTHER="y")
    assert {k for k in env if k.startswith("ONBOARD_")} == {"ONBOARD_PASSED"}
    assert env["OTHER"] == "y" and env["PATH"] == os.environ["PATH"]
    assert inherited()["ONBOARD_SOMETHING"] == "changed mid-command"  # outside a command: read as it is now
    with pytest.raises(ValueError):
        child_env({"NOT_OURS": "x"})


def test_pytest_options_in_the_shell_do_not_reach_the_parity_test(ws, child, monkeypatch):
    monkeypatch.delenv("PYTEST_PLUGINS", raising=False)
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p some_plugin_that_rewrites_results")
    entry = _attempt(ws, [])
    assert "PYTEST_ADDOPTS" not in child[0]
    assert entry["details"]["environment"]["ignored"]["PYTEST_ADDOPTS"] == "-p some_plugin_that_rewrites_results"
