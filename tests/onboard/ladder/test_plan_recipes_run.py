"""Every recipe `onboard plan` writes is one titan_core runs: it loads as a config, sets one execution
mode, titan_core accepts its combination, and `--check` trains it 2 steps finite on the twin in its own
precision, then again with its tp / ep / cp / pp at 2 on gloo processes.

Published configs (the full models only ever on meta) on a twin, each workspace's recipe.toml holding
what a ladder on this CPU earns (per-block compile with the aot_eager backend, one CPU thread, for an MoE
the dense experts its twin was captured with), planned for one target each:
- Qwen3-8B on h100:4 at 32k tokens: eager activations do not fit; CP 4 with the captured step's
  `default` memory policy does (per-block compile off: both modes on is refused), and the check runs
  it at cp 2 on gloo;
- Qwen3-30B-A3B on h200:16: a 2-stage pipeline keeps per-block compile (the recipe's backend) and
  runs the target's grouped experts in bf16, at the MFU they allow; its check runs pp 2 with the
  twin's 2 layers (1F1B: the planned interleaved schedule's 4 stages need 4 layers, said as a shrink);
- (slow) Qwen3-235B-A22B on v7x:256 at seq 4096 and Llama-3.1-70B on v7x:64 at seq 8192 (MaxText's
  Ironwood layouts): a plan that fits, each degree with its reason, one execution mode, run at its
  degrees (each at 2) on the twin.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.plan_time import COMPUTE_EFFICIENCY
from onboard.sizing.plan_check import check_plan_recipe
from onboard.workspace.layout import Workspace
from real_size_configs import PUBLISHED
from titan_core.config import load_config
from titan_core.parallel import check_parallelism

EARNED = """
[compile]
enable = true  # compile rung
backend = "aot_eager"  # the recipe's backend is what the check compiles with; inductor's minute is not this test's

[device]
type = "cpu"
threads = 1  # tuning rung
"""
DENSE_EXPERTS = '\n[kernels]\nmoe = "dense"  # graph_trainer rung, on the twin\n'
CASES = {  # name: (target, --seq, the plan's execution mode, its degrees above 1 among tp / ep / cp / pp)
    "Qwen3-8B": ("h100:4", 32768, "graph_trainer", {"cp"}),
    "Qwen3-30B-A3B": ("h200:16", 4096, "compile", {"pp"}),
}
MUST_SHOW = {  # name: (target, --seq): MaxText's published Ironwood layouts' chip counts and sequences
    "Qwen3-235B-A22B": ("v7x:256", 4096),
    "Llama-3.1-70B": ("v7x:64", 8192),
}


def _workspace(tmp_path, name: str) -> str:
    ws = name.replace("-", "_").replace(".", "_").lower()
    (tmp_path / f"{ws}.json").write_text(json.dumps(PUBLISHED[name][2]))
    width = ["--twin-width", "64"] if name.startswith("Qwen") else []  # narrower, faster; the Llama twins keep 256
    made = CliRunner().invoke(app, ["new-model", ws, "--hf-config", str(tmp_path / f"{ws}.json"), "--dir",
                                    str(tmp_path), "--device", "cpu", "--twin", *width])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    recipe = tmp_path / "onboarding" / ws / "recipe.toml"
    text = recipe.read_text().replace("batch_size = 4", "batch_size = 2").replace("seq_len = 128", "seq_len = 32")
    text = text.replace('[device]\ntype = "cpu"\n', "")
    recipe.write_text(text + EARNED + (DENSE_EXPERTS if PUBLISHED[name][0] == "qwen3_moe" else ""))
    return ws


def _plan_and_check(tmp_path, ws: str, target: str, seq: int) -> dict:
    """`onboard plan --check --json`, its recipe loaded and accepted by titan_core, the check passed with the
    plan's degrees (at 2 on gloo) where it has any above 1."""
    result = CliRunner().invoke(app, ["plan", ws, "--dir", str(tmp_path), "--target", target, "--seq", str(seq),
                                      "--check", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.stderr + result.stdout
    out = json.loads(result.stdout)
    cfg = load_config(out["recipe"])  # the loader's types and ranges
    assert out["recipe"].endswith(f"recipe.{target.replace(':', '-')}.seq{seq}.toml")
    degrees = check_parallelism(cfg, out["target"]["count"])  # titan_core's own acceptance of what was written
    d = out["degrees"]
    assert (degrees.dp_shard, degrees.dp_replicate, degrees.tp, degrees.ep, degrees.cp, degrees.pp) == tuple(
        d[k] for k in ("dp_shard", "dp_replicate", "tp", "ep", "cp", "pp"))  # fmt: skip
    assert all(o["refused"] is None for o in out["options"])  # the table lists only what titan_core runs
    assert out["options_accepted"] + out["refused"]["options"] == out["options_fitting"]
    assert cfg.device.threads == 0 and cfg.training.mixed_precision_param == "bfloat16"
    check = out["check"]
    assert check["loads"] and check["refused"] is None and check["ok"] and check["precision"] == "bf16"
    assert [r["step"] for r in check["rows"]] == [1, 2]
    above = {n for n in ("tp", "ep", "cp", "pp") if d[n] > 1}
    if above:  # the same degrees, at 2, on gloo processes: titan_core ran them, every step finite
        assert check["degrees"]["refused"] is None and check["degrees"]["finite"], check["degrees"]
        assert set(check["degrees"]["degrees"]) == above and [r["step"] for r in check["degrees"]["rows"]] == [1, 2]
    else:
        assert "degrees" not in check
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_plan_recipes_load_and_run_finite_on_the_twin(tmp_path, name):
    target, seq, mode, above = CASES[name]
    ws = _workspace(tmp_path, name)
    out = _plan_and_check(tmp_path, ws, target, seq)
    cfg = load_config(out["recipe"])
    assert {n for n in ("tp", "ep", "cp", "pp") if out["degrees"][n] > 1} == above
    assert (cfg.compile.enable, cfg.graph_trainer.enable) == (mode == "compile", mode == "graph_trainer")
    assert out["check"]["mode"].startswith(mode)
    assert not any(c["key"].startswith("kernels.") for c in out["check"]["changed_here"])
    if PUBLISHED[name][0] == "qwen3_moe":
        # the routed experts in stages: below the compute efficiency only by what the bubble and communication cost
        assert cfg.kernels.moe == "grouped_mm" and cfg.parallelism.data_parallel == "simple_fsdp"
        assert 0.5 * COMPUTE_EFFICIENCY["cuda"] < out["prediction"]["mfu"] < COMPUTE_EFFICIENCY["cuda"]
        assert cfg.compile.backend == "aot_eager"  # the recipe's own backend, kept with its mode
        if cfg.parallelism.pp_schedule == "interleaved1F1B":  # 4 stages at pp 2: more than the twin's 2 layers
            assert any("pp_schedule 1F1B" in n for n in out["check"]["degrees"]["notes"])
    else:
        assert "moe =" not in Path(out["recipe"]).read_text()  # a dense model never gets kernels.moe
        # CP 4 holds the sequence with the captured step, which titan_core runs (its check ran it at cp 2)
        assert out["degrees"]["cp"] == 4 and cfg.graph_trainer.memory_policy == out["chosen"]["policy"]
        # what users met before: both modes on, which titan_core refuses; the check says so
        both = Path(out["recipe"]).with_name("recipe.both.toml")
        text = Path(out["recipe"]).read_text()
        both.write_text(text.replace("[compile]\nenable = false", "[compile]\nenable = true"))
        refused = check_plan_recipe(Workspace.load(tmp_path, ws), both)
        assert refused["loads"] and not refused["ok"] and "two execution modes" in refused["refused"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MUST_SHOW)
def test_the_big_configs_on_v7x_write_recipes_titan_core_runs(tmp_path, name):
    target, seq = MUST_SHOW[name]
    ws = _workspace(tmp_path, name)
    out = _plan_and_check(tmp_path, ws, target, seq)  # the check ran its degrees at 2, every step finite
    d, why, c = out["degrees"], out["degrees_why"], out["chosen"]
    assert out["seq_len"] == seq and c["batch"] >= 1 and c["peak_bytes"] <= out["target"]["budget_bytes"]
    assert set(why) == {"tp", "ep", "cp", "pp", "dp_replicate"}
    assert all(why[n].startswith(f"{n} {d[n]}") for n in why)
    assert 0 < out["prediction"]["mfu"] <= COMPUTE_EFFICIENCY["tpu"]  # communication under the compute at best
    assert (d["ep"] > 1) == (PUBLISHED[name][0] == "qwen3_moe")
    cfg = load_config(out["recipe"])
    levers = {lv["key"]: lv for lv in out["levers"]}
    assert not (cfg.compile.enable and cfg.graph_trainer.enable)  # one execution mode, never both
    if cfg.compile.enable:  # the recipe's per-block compile, kept with every degree the plan chose
        assert not levers["compile.enable"]["changed"]
    elif not cfg.graph_trainer.enable:  # eager: the recipe's compile dropped, with titan_core's reason
        assert levers["compile.enable"]["changed"] and "titan_core refuses" in levers["compile.enable"]["why"]
    if out["chosen"]["data_parallel"] == "simple_fsdp_reshard":  # re-gathering: eager, as titan_core runs it
        assert cfg.parallelism.reshard_after_forward and not cfg.compile.enable and not cfg.graph_trainer.enable
