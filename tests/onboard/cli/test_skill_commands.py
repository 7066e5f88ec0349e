"""Every `onboard ...` command SKILL.md shows in a code block runs, in order, on a debug model.

The placeholders of the skill (NAME, path/to/config.json, RUNG, CRITERION) are filled in
for a tiny llama3 workspace; a command piped into the skill's script runs the script on
the command's real output. Exit codes must be those the skill promises (0, or 1 for a gate
that failed), and --json commands must print one JSON document.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.workspace.resources import data_dir

pytestmark = [pytest.mark.hf, pytest.mark.slow]

SKILL_DIR = data_dir("skills") / "onboard-model"


def skill_commands() -> list[str]:
    blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", (SKILL_DIR / "SKILL.md").read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("onboard ")]


def test_skill_shows_the_loop_commands():
    verbs = [shlex.split(c)[1] for c in skill_commands()]
    assert {"new-model", "next-step", "status", "report", "waive"} <= set(verbs)
    assert verbs.index("new-model") < verbs.index("next-step")


def test_every_skill_command_runs_on_a_debug_model(tmp_path, monkeypatch):
    from transformers import LlamaConfig

    monkeypatch.chdir(tmp_path)
    LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=256,
    ).to_json_file(tmp_path / "config.json")  # fmt: skip
    fill = {"NAME": "debug", "path/to/config.json": str(tmp_path / "config.json")}
    fill.update(RUNG="eager", CRITERION="loss_falls")
    runner = CliRunner()
    ran = []
    for command in skill_commands():
        onboard_part, _, piped = command.partition(" | ")
        args = shlex.split(onboard_part)[1:]
        args = [fill.get(a, a) for a in args]
        result = runner.invoke(app, args)
        # CliRunner reports a crash as exit 1 too: only a SystemExit is the command's own answer
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        assert not crashed, f"{command} raised {result.exception!r}\n{result.output}"
        assert result.exit_code in (0, 1), f"{command}: exit {result.exit_code}\n{result.output}"
        if result.exit_code == 1:
            assert args[0] == "next-step", f"only a gate may fail: {command}"
        if "--json" in args:
            json.loads(result.stdout)
        if piped:
            script = shlex.split(piped)
            assert script[0] == "python"
            out = subprocess.run(
                [sys.executable, str(SKILL_DIR / script[1])], input=result.stdout, capture_output=True, text=True
            )
            assert out.returncode == 0 and out.stdout.startswith("rung "), out.stderr
        ran.append((args[0], result.exit_code, result.output[-3000:]))
    log = "\n".join(f"--- {verb} exit {code}\n{output}" for verb, code, output in ran)
    assert [verb for verb, _, _ in ran].count("next-step") >= 2, log
    # the first next-step ran eager, the second parity: both built rungs were exercised
    assert (tmp_path / "onboarding" / "debug" / "runs" / "parity").is_dir(), log
    status = json.loads(runner.invoke(app, ["status", "debug", "--json"]).stdout)
    assert "parity" in json.dumps(status)
    assert (tmp_path / "onboarding" / "debug" / "REPORT.md").is_file()
