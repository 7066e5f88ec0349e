"""`onboard demo`'s train stage alone (onboard/cli/demo_train.py), on a fresh llama3 debugmodel
workspace as the demo scaffolds it (no climb: the recipe new-model wrote): a pretrained 2-shard
checkpoint and a JSONL corpus written, the recipe run through titan_core.train with validation and
a sharded export, transformers' reload generating what the run's last checkpoint generates.
The checks of what it leaves are the ones test_demo.py runs on the whole demo (demo_train_checks.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)

from onboard.cli.demo import NAME, PRESETS, THREADS_WHY
from onboard.cli.demo_train import StageFailed, check_generation, read_metrics, run_train_stage
from onboard.workspace.layout import Workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace
from titan_core.config.loader import load_config

from demo_train_checks import check_train_stage  # tests/onboard/e2e (tests/onboard/conftest.py)

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


class Lines:
    """The demo's output object (onboard/cli/shared.Out) as text: what it prints and logs."""

    json = False

    def __init__(self):
        self.printed: list[str] = []
        self.logged: list[str] = []

    def print(self, *objects, **kw):
        self.printed.append(" ".join(str(o) for o in objects))

    def log(self, line: str):
        self.logged.append(line)


def test_the_stage_trains_validates_exports_and_generates_the_same_tokens(tmp_path):
    plan = plan_workspace(NAME, tmp_path, preset=PRESETS[NAME], device="cpu", threads=(1, THREADS_WHY))
    write_workspace(plan)
    ws = Workspace.load(tmp_path, NAME)
    out = Lines()
    result = run_train_stage(ws, tmp_path, out=out)
    stdout = "\n".join(out.printed)
    assert result["exit_code"] == 0, (result.get("error"), "\n".join(out.logged[-30:]))
    checked = check_train_stage(tmp_path, stdout)
    # the command ran the workspace's recipe with overrides only, and its rows were shown as they came
    assert result["command"].startswith(f"python -m titan_core.train --config {ws.recipe_path} ")
    assert sum(line.startswith("  step=") for line in out.logged) == len(checked["rows"])
    assert any(line.startswith("  loaded initial weights from ") for line in out.logged), out.logged
    assert result["step1_loss"] == checked["rows"][0]["loss"] and result["final_loss"] == checked["rows"][-1]["loss"]
    assert [v["loss"] for v in result["val_losses"]] == [r["val_loss"] for r in checked["val"]]
    g = result["generation"]
    assert g["equal"] and g["titan_tokens"] == g["hf_tokens"] and len(g["hf_tokens"]) == 8
    json.dumps(result)  # --json emits it as it is
    # the comparison can fail: the checkpoint the run started from generates other tokens
    files = {k: Path(result[k]) for k in ("pretrained", "run")} | {"exported": Path(result["pretrained"])}
    cfg = load_config(ws.recipe_path, [f"--metrics.output_dir={result['run']}", "--checkpoint.enable=true"])
    assert check_generation(cfg, files)["equal"] is False


def test_a_loss_that_is_not_finite_fails_the_stage_naming_it(tmp_path):
    rows = [{"step": s, "loss": 5.0} for s in range(1, 9)]
    rows[3]["val_loss"], rows[7]["val_loss"] = 4.0, math.nan
    rows[5]["loss"] = math.inf
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(StageFailed, match=r"not finite: loss inf at step 6, validation loss nan at step 8"):
        read_metrics(path)
    rows[5]["loss"], rows[7]["val_loss"] = 5.0, 4.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    with pytest.raises(StageFailed, match=r"7 training rows \(want 8\) and validation at steps \[4\]"):
        read_metrics(path)


@pytest.mark.parametrize("preset, train, ladder_code, runs", [
    ("llama3_debug", True, 0, True), ("llama3_debug", False, 0, False), ("llama3_debug", True, 1, False),
    ("flux_debug", True, 0, False),
])  # fmt: skip
def test_the_demo_trains_after_a_complete_llama_ladder_unless_told_not_to(tmp_path, monkeypatch, preset, train,
                                                                          ladder_code, runs):  # fmt: skip
    """The stage runs after the ladder completed, for the language model, without --no-train; its
    exit code (1 when a check failed) is the demo's."""
    from onboard.cli import demo, demo_train

    monkeypatch.setattr(demo, "_climb", lambda base, **kw: {"workspace": "w", "exit_code": ladder_code})
    monkeypatch.setattr(demo.Workspace, "load", lambda base, name: name)
    monkeypatch.setattr(demo_train, "run_train_stage", lambda ws, base, out: {"ws": ws, "exit_code": 1})
    result = demo.run_demo(tmp_path, device="cpu", out=Lines(), preset=preset, train=train)
    assert ("train" in result) is runs
    assert result["exit_code"] == (1 if runs else ladder_code)
    if runs:
        assert result["train"]["ws"] == preset
