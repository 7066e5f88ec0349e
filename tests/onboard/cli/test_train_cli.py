"""`onboard train` says the model's size before it trains (parameters in total and active per token,
titan_core's count_params), and with --json prints one JSON document: exit code, steps run, final
loss, the counts, the run folder."""

from __future__ import annotations

import json

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from typer.testing import CliRunner

import titan_core.train
from onboard.cli.app import app
from onboard.workspace.scaffold import plan_workspace, write_workspace
from titan_core.config.loader import load_config
from titan_core.models.model_builder import build_model_from_config

runner = CliRunner()


def _recipe(tmp_path, preset: str):
    name = preset.split("/")[0]
    write_workspace(plan_workspace(name, tmp_path, preset=preset, device="cpu"))
    return tmp_path / "onboarding" / name / "recipe.toml"


def test_train_json_reports_the_run_and_the_models_own_parameter_count(tmp_path):
    recipe = _recipe(tmp_path, "llama3/debugmodel")
    run = tmp_path / "run"
    tiny = ["--training.steps=1", "--training.batch_size=1", "--training.seq_len=16", f"--metrics.output_dir={run}"]
    result = runner.invoke(app, ["train", "--config", str(recipe), "--json", *tiny])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)  # stdout is the JSON document and nothing else
    model = build_model_from_config(load_config(recipe).model)[2]
    total = sum(p.numel() for p in model.parameters())
    assert (data["params_total"], data["params_active"]) == (total, total)  # dense: every parameter active
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert data["exit_code"] == 0 and data["steps_run"] == data["last_step"] == data["steps_planned"] == 1
    assert data["final_loss"] == rows[-1]["loss"] and data["run"] == str(run) and data["stopped"] is None


def test_train_text_prints_total_and_active_before_training(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, "qwen3_moe/debugmodel")
    started = []
    monkeypatch.setattr(titan_core.train, "main", lambda argv: started.append(argv) or 0)  # the counts come first
    result = runner.invoke(app, ["train", "--config", str(recipe)])
    assert result.exit_code == 0 and len(started) == 1, result.stderr
    _, args, model = build_model_from_config(load_config(recipe).model)
    total = sum(p.numel() for p in model.parameters())
    # a token uses top_k of the n_experts routed experts (SwiGLU: 3 matrices of dim x moe_hidden_dim each)
    idle = args.n_layers * (args.n_experts - args.top_k) * 3 * args.dim * args.moe_hidden_dim
    line = f"parameters: {total:,} in total, {total - idle:,} active per token ({(total - idle) / total:.1%})"
    assert result.stdout.splitlines()[0] == line


@pytest.mark.parametrize("args", [["--print-config"], ["--nproc", "0"], ["--training.stepz=1"]])
def test_train_json_bad_input_is_one_json_error(tmp_path, args):
    recipe = _recipe(tmp_path, "llama3/debugmodel")
    result = runner.invoke(app, ["train", "--config", str(recipe), "--json", *args])
    assert result.exit_code == 2
    assert set(json.loads(result.stdout)) == {"error", "exit_code"}


# ---- onboard train NAME [--steps N]: the workspace's recipe -------------------------------------
def _started(monkeypatch) -> list:
    """titan_core.train.main replaced: what argv `onboard train` would train with (the counts come first)."""
    started = []
    monkeypatch.setattr(titan_core.train, "main", lambda argv: started.append(argv) or 0)
    return started


def test_train_name_runs_the_workspaces_recipe_with_steps(tmp_path):
    recipe = _recipe(tmp_path, "llama3/debugmodel")
    result = runner.invoke(app, ["train", "llama3", "--steps", "1", "--dir", str(tmp_path), "--json",
                                 "--training.batch_size=1", "--training.seq_len=16"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    # the recipe's own output folder (relative to the recipe), so the workspace's recipe is what ran
    assert data["run"] == str((recipe.parent / "runs" / "train").resolve())
    assert data["steps_planned"] == data["steps_run"] == 1 and data["exit_code"] == 0


@pytest.mark.parametrize("args, argv_tail", [
    (["llama3", "--steps", "3", "--training.batch_size", "2"], ["--training.batch_size", "2", "--training.steps=3"]),
    (["llama3"], []),
])  # fmt: skip
def test_train_name_hands_titan_core_the_recipe_and_the_overrides(tmp_path, monkeypatch, args, argv_tail):
    recipe = _recipe(tmp_path, "llama3/debugmodel")
    started = _started(monkeypatch)
    result = runner.invoke(app, ["train", *args, "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.stderr
    assert started == [["--config", str(recipe.resolve()), *argv_tail]]


def test_train_config_keeps_working_with_a_spaced_override(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, "llama3/debugmodel")
    started = _started(monkeypatch)
    result = runner.invoke(app, ["train", "--config", str(recipe), "--training.steps", "2", "--steps", "4"])
    assert result.exit_code == 2 and "--steps and --training.steps" in result.stderr  # two answers: refused
    result = runner.invoke(app, ["train", "--config", str(recipe), "--training.steps", "2"])
    assert result.exit_code == 0, result.stderr
    assert started == [["--config", str(recipe), "--training.steps", "2"]]


@pytest.mark.parametrize("args, needle", [
    (["nope"], "no workspace 'nope'"),
    (["llama3", "--config", "RECIPE"], "not both"),
    ([], "onboard train NAME"),
    (["llama3", "--steps", "0"], "--steps must be at least 1"),
])  # fmt: skip
def test_train_name_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, args, needle):
    recipe = _recipe(tmp_path, "llama3/debugmodel")
    started = _started(monkeypatch)
    argv = [str(recipe) if a == "RECIPE" else a for a in args]
    result = runner.invoke(app, ["train", *argv, "--dir", str(tmp_path)])
    assert result.exit_code == 2 and started == []
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


def test_train_help_shows_the_name_form():
    result = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "train [NAME] [OPTIONS]" in result.stdout and "onboard train NAME [--steps N]" in result.stdout
    assert "--steps" in result.stdout and "--config" in result.stdout
