"""Every recipe `onboard plan` writes is one titan_core runs: it loads as a config, sets one execution
mode, titan_core accepts its combination, and `--check` runs its layout on the twin (each degree above 1
at 2 on gloo processes, the mode and memory policy, the sequence and batch where they fit), 2 steps finite
in its own precision, rank 0's tensors within 25% of the memory estimate for that layout.

Published configs (the full models only ever on meta) on a twin, each workspace's recipe.toml holding
what a ladder on this CPU earns (per-block compile with the aot_eager backend, one CPU thread, for an MoE
the dense experts its twin was captured with), planned for one target each: Qwen3-8B on h100:4 at 32k
tokens and Qwen3-30B-A3B on h200:16; Qwen3-235B-A22B on v7x:256 at seq 4096 and Llama-3.1-70B on
v7x:64 at seq 8192 (MaxText's Ironwood chip counts); and the production configs the twins were made for
(Qwen3-8B on v7x:8, Llama-3.2-1B, Gemma-2-9B and Mixtral-8x7B through transformers' classes), fresh
workspaces: every recipe the plan writes passes its own --check.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.plan.step_time import COMPUTE_EFFICIENCY
from onboard.sizing.plan.check import check_plan_recipe
from onboard.workspace.layout import Workspace
from real_size_configs import GEMMA2_9B, MIXTRAL, PUBLISHED
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
CASES = {  # name: (target, --seq)
    "Qwen3-8B": ("h100:4", 32768),
    "Qwen3-30B-A3B": ("h200:16", 4096),
}
MUST_SHOW = {  # name: (target, --seq): MaxText's published Ironwood layouts' chip counts and sequences
    "Qwen3-235B-A22B": ("v7x:256", 4096),
    "Llama-3.1-70B": ("v7x:64", 8192),
}


def _workspace(tmp_path, name: str) -> str:
    ws = name.replace("-", "_").replace(".", "_").lower()
    (tmp_path / f"{ws}.json").write_text(json.dumps(PUBLISHED[name][2]))
    made = CliRunner().invoke(app, ["new-model", ws, "--hf-config", str(tmp_path / f"{ws}.json"), "--dir",
                                    str(tmp_path), "--device", "cpu", "--twin"])  # fmt: skip
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
    check_ran_the_plan(out)
    return out


def check_ran_the_plan(out: dict) -> None:
    """`--check` ran the plan's layout (each degree above 1 at 2, dp_replicate and then dp_shard shed only past
    8 ranks and said), its mode and memory policy, its sequence or the longest that fits (said), every step
    finite, and rank 0's tensors within 25% of the estimate for that layout."""
    d, c, check = out["degrees"], out["chosen"], out["check"]
    assert check["loads"] and check["refused"] is None and check["ok"] and check["precision"] == "bf16", check
    assert [r["step"] for r in check["rows"]] == [1, 2] and check["finite"]
    ran, said = check["ran"], {ch["key"]: ch for ch in check["changed_here"]}
    for n in ("dp_replicate", "dp_shard", "tp", "ep", "cp", "pp"):
        want = 2 if d[n] > 1 else 1
        assert ran["degrees"][n] == want or (n in ("dp_replicate", "dp_shard") and ran["degrees"][n] == 1
                                             and "processes at most here" in said[f"parallelism.{n}"]["why"])
    p = ran["degrees"]
    assert ran["ranks"] == p["pp"] * p["dp_replicate"] * p["dp_shard"] * p["cp"] * p["tp"] <= 8
    assert check["mode"].startswith(c["mode"] if c["mode"] != "scan" else "graph_trainer")
    if c["mode"] in ("graph_trainer", "scan"):
        assert ran["memory_policy"] == c["policy"]
    else:
        assert ran["activation_checkpoint"] == {"none": "none", "default": "selective op", "full": "full"}[c["policy"]]
    assert ran["seq_len"] == out["seq_len"] or "fits here" in said["training.seq_len"]["why"]
    assert ran["batch"] == c["batch"] or "fits here" in said["training.batch_size"]["why"]
    m = check["memory"]
    assert m["within"] and abs(m["ratio"] - 1) <= 0.25 and m["predicted_bytes"] > 0, m


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_plan_recipes_load_and_run_finite_on_the_twin(tmp_path, name):
    target, seq = CASES[name]
    ws = _workspace(tmp_path, name)
    out = _plan_and_check(tmp_path, ws, target, seq)
    cfg = load_config(out["recipe"])
    c = out["chosen"]
    assert (cfg.compile.enable, cfg.graph_trainer.enable) == (c["mode"] == "compile",
                                                               c["mode"] in ("graph_trainer", "scan"))  # fmt: skip
    assert out["why_chosen"].startswith(c["sharding"])
    assert not any(ch["key"].startswith("kernels.") for ch in out["check"]["changed_here"])
    if PUBLISHED[name][0] == "qwen3_moe":  # a captured or compiled step runs the target's routed experts
        assert cfg.kernels.moe == ("grouped_mm" if c["mode"] != "eager" else cfg.kernels.moe)
        if cfg.compile.enable:
            assert cfg.compile.backend == "aot_eager"  # the recipe's own backend, kept with its mode
    else:
        assert "moe =" not in Path(out["recipe"]).read_text()  # a dense model never gets kernels.moe
    # what users met before: both modes on, which titan_core refuses; the check says so
    both = Path(out["recipe"]).with_name("recipe.both.toml")
    text = Path(out["recipe"]).read_text()
    both_on = re.sub(r"(\[(?:compile|graph_trainer)\]\nenable = )false", r"\1true", text)
    both.write_text(re.sub(r'(\[activation_checkpoint\]\nmode = )"\w+"', r'\1"none"', both_on))
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
    assert why["ep"].startswith(f"ep {d['ep']}") and ("no experts" in why["ep"]) == (PUBLISHED[name][0] != "qwen3_moe")
    cfg = load_config(out["recipe"])
    levers = {lv["key"]: lv for lv in out["levers"]}
    assert not (cfg.compile.enable and cfg.graph_trainer.enable)  # one execution mode, never both
    if cfg.compile.enable:  # the recipe's per-block compile, kept with every degree the plan chose
        assert not levers["compile.enable"]["changed"]
    elif not cfg.graph_trainer.enable:  # eager: the recipe's compile dropped, with titan_core's reason
        assert levers["compile.enable"]["changed"] and "titan_core refuses" in levers["compile.enable"]["why"]
    if out["chosen"]["data_parallel"] == "simple_fsdp_reshard":  # re-gathering: eager, as titan_core runs it
        assert cfg.parallelism.reshard_after_forward and not cfg.compile.enable and not cfg.graph_trainer.enable


PRODUCTION = {  # workspace: (config, path, target, --seq)
    "qwen3_8b": (PUBLISHED["Qwen3-8B"][2], "native", "v7x:8", 4096),
    "llama32_1b": (PUBLISHED["Llama-3.2-1B"][2], "native", "h100:8", 8192),
    "gemma2_9b": (GEMMA2_9B, "transformers", "v7x:8", 8192),
    "mixtral": (MIXTRAL, "transformers", "h100:16", 4096),
}


@pytest.mark.slow
@pytest.mark.parametrize("ws", list(PRODUCTION))
def test_every_production_config_plan_passes_its_own_check(tmp_path, ws):
    config, path, target, seq = PRODUCTION[ws]
    (tmp_path / f"{ws}.json").write_text(json.dumps(config))
    made = CliRunner().invoke(app, ["new-model", ws, "--hf-config", str(tmp_path / f"{ws}.json"), "--dir",
                                    str(tmp_path), "--device", "cpu", "--twin", "--path", path])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    out = _plan_and_check(tmp_path, ws, target, seq)
    cfg = load_config(out["recipe"])
    if ws == "gemma2_9b":  # its layers alternate sliding and global windows: never scanned
        assert not cfg.graph_trainer.scan_layers and out["chosen"]["mode"] != "scan"
        # every layer caps its scores, which only the naive core applies: the memory model counts the scores
        assert cfg.kernels.attention == load_config(Path(out["recipe"]).with_name("recipe.toml")).kernels.attention
