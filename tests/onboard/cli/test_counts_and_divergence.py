"""Counts out of range are bad input (exit 2, nothing written); a diverged run says where and why;
metrics.jsonl is strict JSON with one current row per step, also after a resume; a gate that
runs other steps than the recipe's says so."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from hang_guard import hang_guard
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.rungs import eager_rung as eager
from onboard.ladder.contract import RungContext
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.layout import Workspace
from titan_core.config import ConfigError, JobConfig, describe, load_config
from titan_core.measure.metrics import read_metrics
from titan_core.train import main, run
from titan_core.training.trainer import TrainResult

TINY = [
    "--model.overrides={n_layers = 1, dim = 32, n_heads = 2, n_kv_heads = 1, ffn_hidden_dim = 64, vocab_size = 128}",
    "--training.batch_size=2",
    "--training.seq_len=16",
    "--training.deterministic",
    "--device.type=cpu",
    "--device.threads=1",
    "--metrics.rich=false",
    "--parallelism.data_parallel=none",
]


def _strict(text: str) -> list[dict]:
    """Parse metrics.jsonl as strict JSON: a bare NaN / Infinity fails the test."""

    def refuse(name):
        raise AssertionError(f"metrics.jsonl holds the non-JSON constant {name}")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


# ---- counts --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override, key, value, rule",
    [
        ("--training.steps=-1", "training.steps", "-1", ">= 1"),
        ("--training.steps=0", "training.steps", "0", ">= 1"),
        ("--training.batch_size=0", "training.batch_size", "0", ">= 1"),
        ("--training.seq_len=-3", "training.seq_len", "-3", ">= 1"),
        ("--training.grad_accum=0", "training.grad_accum", "0", ">= 1"),
        ("--metrics.log_freq=0", "metrics.log_freq", "0", ">= 1"),
        ("--lr_scheduler.warmup_steps=-1", "lr_scheduler.warmup_steps", "-1", ">= 0"),
        ("--device.threads=-2", "device.threads", "-2", ">= 0"),
        ("--parallelism.tp=0", "parallelism.tp", "0", ">= 1 or -1"),
        ("--optimizer.lr=nan", "optimizer.lr", "nan", ">= 0"),
    ],
)
def test_a_count_out_of_range_exits_2_with_one_line_and_writes_nothing(override, key, value, rule, tmp_path, capsys):
    out = tmp_path / "run"
    code = main([*TINY, override, f"--metrics.output_dir={out}"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: {key} = {value} ") and f"must be {rule}" in lines[0]
    assert not out.exists()
    with pytest.raises(ConfigError, match=f"^{key} = "):
        load_config(None, [override])


def test_an_override_may_correct_the_recipe_and_a_config_made_in_code_is_checked(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[training]\nsteps = -5\n")
    with pytest.raises(ConfigError, match=r"^.*r\.toml: training.steps = -5 is out of range: it must be >= 1$"):
        load_config(recipe)
    assert load_config(recipe, ["--training.steps=3"]).training.steps == 3
    cfg = load_config(None, [*TINY, f"--metrics.output_dir={tmp_path / 'code'}"])
    cfg.training.batch_size = 0
    with pytest.raises(ConfigError, match="training.batch_size = 0"):
        run(cfg)
    assert not (tmp_path / "code").exists()


def test_every_range_is_stated_in_its_field_docstring():
    docs = describe()
    ranged = 0
    for sec in dataclasses.fields(JobConfig):
        for f in dataclasses.fields(sec.default_factory()):
            if "range" in f.metadata:
                ranged += 1
                assert str(f.metadata["range"]) in docs[sec.name][f.name], f"{sec.name}.{f.name}"
    assert ranged >= 10  # steps, batch_size, seq_len, grad_accum, warmup, log_freq, degrees, threads, ...


def test_the_entry_points_refuse_a_non_positive_count_in_a_recipe(tmp_path):
    recipe = tmp_path / "debug.toml"
    recipe.write_text(
        '[model]\nfamily = "llama3"\nflavor = "debugmodel"\n[device]\ntype = "cpu"\n'
        f'[metrics]\noutput_dir = "{tmp_path / "out"}"\n'
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    with hang_guard(120, "titan_core.train --training.steps=-1") as guard:
        proc = subprocess.run(
            [sys.executable, "-m", "titan_core.train", "--config", str(recipe), "--training.steps=-1"],
            capture_output=True,
            text=True,
            env=env,
            timeout=guard.timeout_s,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: training.steps = -1 is out of range: it must be >= 1"
    res = CliRunner().invoke(app, ["train", "--config", str(recipe), "--training.batch_size=0"])
    assert res.exit_code == 2 and "training.batch_size = 0 is out of range" in res.stderr
    assert not (tmp_path / "out").exists()


# ---- divergence ----------------------------------------------------------------------------
def test_a_diverged_run_names_the_step_the_loss_and_the_last_finite_grad_norm(tmp_path, capsys):
    out = tmp_path / "run"
    code = main([*TINY, "--training.steps=6", "--optimizer.lr=1e9", f"--metrics.output_dir={out}"])
    err = capsys.readouterr().err
    assert code == 1
    rows = _strict((out / "metrics.jsonl").read_text())
    bad = rows[-1]
    assert len(rows) < 6
    finite = [r for r in rows if r["grad_norm"] is not None]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: training diverged: ")
    if bad["loss"] is None:  # the loss went non-finite first
        assert bad["loss_repr"] in ("nan", "inf", "-inf")
        assert f"the loss at step {bad['step']} is {bad['loss_repr']}" in last
    else:  # a grad norm went non-finite first, with a finite loss: the run stops there too, naming it
        assert bad["grad_norm"] is None and bad["grad_norm_repr"] in ("nan", "inf", "-inf")
        assert f"the grad norm at step {bad['step']} is {bad['grad_norm_repr']}" in last
    assert f"the last finite grad norm was {finite[-1]['grad_norm']:.6g} (step {finite[-1]['step']})" in last
    # the one reader restores the floats every caller compares with math.isfinite
    back = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in back] == [r["step"] for r in rows]
    assert math.isfinite(back[0]["loss"]) and not (math.isfinite(back[-1]["loss"]) and math.isfinite(back[-1]["grad_norm"]))


# ---- metrics.jsonl and resume --------------------------------------------------------------
def test_a_resumed_run_replaces_the_rows_after_its_checkpoint(tmp_path):
    out = tmp_path / "run"
    common = [*TINY, f"--metrics.output_dir={out}", "--checkpoint.enable", "--checkpoint.interval=2"]
    first = run(load_config(None, [*common, "--training.steps=4"]))
    assert [r["step"] for r in first.metrics] == [1, 2, 3, 4]
    shutil.rmtree(out / "checkpoints" / "step-4")  # as if the run died after step 4's row, before its save
    second = run(load_config(None, [*common, "--training.steps=4"]))
    assert second.resumed_from == 2 and [r["step"] for r in second.metrics] == [3, 4]
    raw = _strict((out / "metrics.jsonl").read_text())
    assert [r["step"] for r in raw] == [1, 2, 3, 4]  # no line of the superseded steps 3, 4 is left
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[:2] == first.metrics[:2] and rows[2:] == second.metrics
    assert [r["step_time_s"] for r in rows[2:]] != [r["step_time_s"] for r in first.metrics[2:]]  # really rerun


def test_the_reader_drops_superseded_rows_restores_non_finite_floats_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 1, "loss": 2.0},
        {"step": 2, "loss": None, "loss_repr": "nan"},
        {"step": 1, "loss": 3.0},  # an appended second run: supersedes both rows above
        {"step": 2, "loss": None, "loss_repr": "-inf", "mfu": None, "mfu_repr": "inf"},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3, "lo')
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["loss"] == 3.0 and rows[1]["loss"] == -math.inf and rows[1]["mfu"] == math.inf
    path.write_text('{"step": 1, "loss": 2.0}\nnot json\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a metrics row"):
        read_metrics(path)


# ---- the gate's steps ----------------------------------------------------------------------
def _workspace(tmp_path, steps: int) -> Workspace:
    write_workspace(plan_workspace("dbg", tmp_path, preset="llama3/debugmodel", device="cpu"))
    ws = Workspace.load(tmp_path, "dbg")
    text = ws.recipe_path.read_text()
    assert "steps = 20" in text
    ws.recipe_path.write_text(text.replace("steps = 20", f"steps = {steps}"))
    return ws


def _fake_run(cfg, quiet=False):
    """The rows a working eager run would log, without training (the gate's logic is under test)."""
    rows = [
        {
            "step": s,
            "loss": 7.6 - 0.1 * s,
            "grad_norm": 1.0,
            "lr": 1e-3,
            "tokens_per_s": 1e3,
            "mfu": 0.01,
            "peak_mem_bytes": 1 << 20,
            "step_time_s": 0.01,
        }
        for s in range(1, cfg.training.steps + 1)
    ]
    return TrainResult(metrics=rows, num_params=1, flops_per_token=1.0, device="cpu")


def test_the_eager_gate_says_it_runs_other_steps_than_the_recipe(tmp_path, monkeypatch):
    ws = _workspace(tmp_path, steps=7)
    monkeypatch.setattr("titan_core.train.run", _fake_run)
    logged: list[str] = []
    attempt = ws.runs_dir / "eager" / "attempt-1"
    attempt.mkdir(parents=True)
    result = eager.run(RungContext(workspace=ws, attempt_dir=attempt, evidence={}, log=logged.append))
    assert result.measurements["steps_run"] == 20
    assert "eager: the gate runs 20 steps (recipe says 7)" in logged
    assert "the gate runs 20 steps (recipe says 7)" in result.details["gate_overrides"]
    assert result.details["stopped"] is None


def test_a_recipe_with_negative_steps_is_bad_input_at_next_step(tmp_path):
    ws = _workspace(tmp_path, steps=-5)
    res = CliRunner().invoke(app, ["next-step", "dbg", "--dir", str(tmp_path), "--json"])
    assert res.exit_code == 2, res.stderr
    assert "training.steps = -5 is out of range: it must be >= 1" in json.loads(res.stdout)["error"]
    assert json.loads((ws.root / "ladder.json").read_text())["attempts"] == []
    assert not (ws.root / "runs" / "eager").exists()
