"""Every recipe `onboard plan` writes runs: it loads as a config, sets one execution mode, and
`--check` trains it 2 steps finite on the twin, in its own precision.

The published Qwen3-8B and Qwen3-235B-A22B configs (the full models only ever on meta) on a
narrow twin (--twin-width 64), each workspace's recipe.toml holding what a ladder on
this CPU earns (per-block compile, one CPU thread, for the MoE the dense experts its twin was
captured with), planned for one target each: the 8B on v7x:64, whose captured step must switch
per-block compile off (both on is refused), and the 235B on h200:64, whose eager step keeps
per-block compile (with the recipe's backend) and runs the target's grouped experts in bf16,
at the MFU the routed experts allow (carried to the target, the dense ones cut a 235B plan on v7x:64
to seq 256 at a predicted MFU of 5%).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.plan import EFFICIENCY
from onboard.sizing.plan_check import check_plan_recipe
from onboard.workspace.layout import Workspace
from real_size_configs import PUBLISHED
from titan_core.config import load_config

EARNED = """
[compile]
enable = true  # compile rung
backend = "aot_eager"  # the recipe's backend is what the check compiles with; inductor's minute is not this test's

[device]
type = "cpu"
threads = 1  # tuning rung
"""
CASES = {  # name: (target, what the MoE recipe adds, the plan's execution mode)
    "Qwen3-8B": ("v7x:64", "", "graph_trainer"),
    "Qwen3-235B-A22B": ("h200:64", '\n[kernels]\nmoe = "dense"  # graph_trainer rung, on the twin\n', "compile"),
}


def _workspace(tmp_path, name: str) -> str:
    ws = name.replace("-", "_").replace(".", "_").lower()
    (tmp_path / f"{ws}.json").write_text(json.dumps(PUBLISHED[name][2]))
    made = CliRunner().invoke(app, ["new-model", ws, "--hf-config", str(tmp_path / f"{ws}.json"), "--dir",
                                    str(tmp_path), "--device", "cpu", "--twin", "--twin-width", "64"])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    recipe = tmp_path / "onboarding" / ws / "recipe.toml"
    text = recipe.read_text().replace("batch_size = 4", "batch_size = 2").replace("seq_len = 128", "seq_len = 32")
    text = text.replace('[device]\ntype = "cpu"\n', "")
    recipe.write_text(text + EARNED + CASES[name][1])
    return ws


@pytest.mark.parametrize("name", list(CASES))
def test_plan_recipes_load_and_run_finite_on_the_twin(tmp_path, name):
    target, _, mode = CASES[name]
    ws = _workspace(tmp_path, name)
    result = CliRunner().invoke(app, ["plan", ws, "--dir", str(tmp_path), "--target", target, "--check", "--json"])
    assert result.exit_code == 0, result.stderr + result.stdout
    out = json.loads(result.stdout)
    cfg = load_config(out["recipe"])  # the loader's types and ranges
    assert out["recipe"].endswith(f"recipe.{target.replace(':', '-')}.seq{out['seq_len']}.toml")
    assert (cfg.compile.enable, cfg.graph_trainer.enable) == (mode == "compile", mode == "graph_trainer")
    assert cfg.device.threads == 0 and cfg.training.mixed_precision_param == "bfloat16"
    if PUBLISHED[name][0] == "qwen3_moe":
        assert cfg.kernels.moe == "grouped_mm" and out["prediction"]["mfu"] == pytest.approx(EFFICIENCY)
    else:
        assert "moe =" not in Path(out["recipe"]).read_text()  # a dense model never gets kernels.moe
    check = out["check"]
    assert check["loads"] and check["refused"] is None and check["ok"] and check["precision"] == "bf16"
    assert check["mode"].startswith(mode) and not any(c["key"].startswith("kernels.") for c in check["changed_here"])
    assert [r["step"] for r in check["rows"]] == [1, 2]
    if mode == "graph_trainer":  # what users met: both modes on, which titan_core refuses; the check says so
        both = Path(out["recipe"]).with_name("recipe.both.toml")
        both.write_text(Path(out["recipe"]).read_text().replace("[compile]\nenable = false", "[compile]\nenable = true"))
        refused = check_plan_recipe(Workspace.load(tmp_path, ws), both)
        assert refused["loads"] and not refused["ok"] and "two execution modes" in refused["refused"]
