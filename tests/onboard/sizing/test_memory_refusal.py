"""Real-size configs are refused in seconds, before any weight is allocated, with the estimate.

The configs are the published Llama-3-70B and Qwen3-8B config.json numbers. Nothing sets a
memory limit: the refusal comes from the estimate against the machine's own available
memory (1.3 TiB and 153 GiB of fp32 training state are more than any CI host has), and
the short wall clock shows nothing was materialised first.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import hang_guard, stretch
from typer.testing import CliRunner

from onboard.cli.app import app

LLAMA3_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
}  # fmt: skip
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 151936, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
    "max_position_embeddings": 40960, "tie_word_embeddings": False, "hidden_act": "silu",
    "attention_bias": False, "torch_dtype": "bfloat16",
}  # fmt: skip
# exact parameter counts of the meta builds (untied heads), as the message states them
CASES = {"llama3": (LLAMA3_70B, "70,553,706,496"), "qwen3": (QWEN3_8B, "8,190,735,360")}
WALL_S = 30
ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
ONBOARD = Path(sys.executable).with_name("onboard")


def _run(argv, cwd=None) -> tuple[subprocess.CompletedProcess, float]:
    """(the finished command, its wall time over the load's stretch when it started: what an idle machine's
    run would take, so that a bound of seconds does not fail a refusal only because other work held the cores)."""
    t0 = time.perf_counter()
    with hang_guard(120, " ".join(map(str, argv[:3]))) as guard:
        proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=guard.timeout_s)
    return proc, (time.perf_counter() - t0) / stretch(guard.start)


def _assert_refused(proc, wall_s: float, params: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert wall_s < WALL_S, f"refusal took {wall_s:.1f} s (scaled to an idle machine)"
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    assert f"the run does not fit in memory: {params} parameters, estimated peak" in line
    assert "optimizer state" in line and "activations" in line and "the budget is" in line
    assert "a smaller twin of the model for runs on this CPU (the same architecture with fewer or narrower" in line
    return line


def test_train_entry_refuses_a_real_size_config_in_seconds(tmp_path):
    """`python -m titan_core.train` of Qwen3-8B; Llama-3-70B goes through the same `main` as `onboard train` in
    test_new_model_workspace_of_llama3_70b_is_refused_by_next_step_and_train, asserted the same way."""
    family = "qwen3"
    hf, params = CASES[family]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "recipe.toml").write_text(
        f'[model]\nfamily = "{family}"\nhf_config = "config.json"\n'
        "[training]\nsteps = 2\nbatch_size = 4\nseq_len = 128\n"
        f'[device]\ntype = "cpu"\n[metrics]\noutput_dir = "{tmp_path / "runs"}"\n'
    )
    proc, wall = _run([sys.executable, "-m", "titan_core.train", "--config", str(tmp_path / "recipe.toml")])
    line = _assert_refused(proc, wall, params)
    assert "MemAvailable" in line or "cgroup" in line or "ulimit" in line  # the machine's own budget
    assert not (tmp_path / "runs" / "metrics.jsonl").exists()


def test_new_model_workspace_of_llama3_70b_is_refused_by_next_step_and_train(tmp_path):
    """--no-twin: the gates would run the full model, which the trainer refuses before it allocates."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_70B))
    # the workspace is made in this process (what is timed are the refusals, each a command of its own)
    made = CliRunner().invoke(app, ["new-model", "big", "--hf-config", str(tmp_path / "config.json"),
                                    "--dir", str(tmp_path), "--device", "cpu", "--no-twin"])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    proc, wall = _run([str(ONBOARD), "next-step", "big", "--dir", str(tmp_path)])
    _assert_refused(proc, wall, CASES["llama3"][1])
    recipe = tmp_path / "onboarding" / "big" / "recipe.toml"
    proc, wall = _run([str(ONBOARD), "train", "--config", str(recipe)])  # titan_core.train's main, in process
    line = _assert_refused(proc, wall, CASES["llama3"][1])
    assert "MemAvailable" in line or "cgroup" in line or "ulimit" in line  # the machine's own budget
    assert not list(recipe.parent.rglob("metrics.jsonl"))  # no step ran, in either command


def test_new_model_fit_warning_says_the_full_model_cannot_train_here(tmp_path):
    from onboard.sizing.fit import fit_warning
    from onboard.workspace.scaffold import plan_workspace

    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_70B))
    plan = plan_workspace("big", tmp_path, hf_config=tmp_path / "config.json", device="cpu")
    t0 = time.perf_counter()
    warning = fit_warning(plan.hf_config, plan.family, recipe_text=plan.files["recipe.toml"])
    assert time.perf_counter() - t0 < WALL_S  # a 70B meta build and its estimate: seconds
    # the tightest gate run is named: simple_fsdp's ranks each build the whole fp32 model on one host
    assert warning.startswith(
        "the full model cannot train on cpu as this workspace is set up: simple_fsdp (2 processes on this host): "
        "estimated peak"
    )
    assert "next-step will refuse it" in warning and "\n" not in warning
    small = plan_workspace("small", tmp_path, preset="llama3/debugmodel", device="cpu")
    assert fit_warning(small.hf_config, small.family, recipe_text=small.files["recipe.toml"]) is None
