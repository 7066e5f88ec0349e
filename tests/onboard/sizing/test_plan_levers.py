"""`onboard plan`'s re-decided levers, its file name and its sequence warning.

The levers a recipe earned on this machine or its twin (the dense experts a 16-expert twin was
captured with, a CPU thread count, kernels a CPU timing kept) are decided again for the target;
a dense model never gets kernels.moe; the plan recipe's name carries the sequence; a --seq past
the config's max_position_embeddings is warned about on stderr and in --json.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.plan.planner import parse_target
from onboard.sizing.plan.levers import merged, mode_levers, planning_kernels
from onboard.sizing.plan.workspace import recipe_name
from real_size_configs import PUBLISHED
from titan_core.config import from_dict
from titan_core.models.registry import get_family

EARNED = {  # what a ladder on this CPU can leave in recipe.toml
    "compile": {"enable": True},
    "kernels": {"moe": "dense", "attention": "naive", "loss": "plain", "ce_chunk": 256},
    "device": {"type": "cpu", "threads": 2},
}
MOE = get_family("qwen3_moe").flavors["235B-A22B"]
MOE_TWIN = get_family("qwen3_moe").flavors["debugmodel"]
DENSE = get_family("qwen3").flavors["8B"]


def by_key(levers) -> dict:
    return {lv.key: lv for lv in levers}


def test_twin_and_cpu_levers_are_re_decided_for_accelerators():
    cfg = from_dict(EARNED)
    for target, routed in (("v7x:64", "tokamax"), ("h100:64", "grouped_mm")):
        kernels, levers = planning_kernels(cfg, MOE, parse_target(target), twin_args=MOE_TWIN)
        got = by_key(levers)
        # the memory model plans with the target's kernels, not the twin's
        assert (kernels.moe, kernels.attention, kernels.loss, kernels.ce_chunk) == (routed, "sdpa", "fused_ce", 1024)
        assert {k: (lv.recipe, lv.plan) for k, lv in got.items()} == {
            "kernels.moe": ("dense", routed), "kernels.attention": ("naive", "sdpa"),
            "kernels.loss": ("plain", "fused_ce"), "kernels.ce_chunk": (256, 1024), "device.threads": (2, 0),
        }  # fmt: skip
        assert "the twin's 8 experts" in got["kernels.moe"].why and "16x the expert FLOPs" in got["kernels.moe"].why
        assert "vocabulary of 2048" in got["kernels.loss"].why and all(lv.changed and lv.why for lv in levers)


def test_one_execution_mode_and_the_experts_the_chosen_option_runs():
    cfg = from_dict(EARNED)
    target = parse_target("h100:64")
    kernels, levers = planning_kernels(cfg, MOE, target, twin_args=MOE_TWIN)
    captured = by_key(merged(levers + mode_levers(cfg, MOE, target, kernels, "default", "grouped_mm", mode="graph_trainer")))
    assert (captured["graph_trainer.enable"].plan, captured["compile.enable"].plan) == (True, False)
    assert "refuses beside per-block compile" in captured["compile.enable"].why
    eager = by_key(mode_levers(cfg, MOE, target, kernels, "none", kernels.moe, mode="compile"))
    assert (eager["graph_trainer.enable"].plan, eager["compile.enable"].plan) == (False, True)
    assert not eager["compile.enable"].changed and "kernels.moe" not in eager
    # an eager layout titan_core refuses compiled (CP, PP) runs uncompiled, titan_core's reason in the why
    why = "parallelism.reshard_after_forward runs eager only"
    off = by_key(mode_levers(cfg, MOE, target, kernels, "none", kernels.moe, mode="eager", compile_refused=why))
    assert off["compile.enable"].changed and off["compile.enable"].plan is False and why in off["compile.enable"].why
    eager = by_key(mode_levers(cfg, MOE, target, kernels, "none", kernels.moe, mode="compile", captured_refused=why))
    assert eager["graph_trainer.enable"].plan is False and why in eager["graph_trainer.enable"].why
    # the reference loop in an eager step stays; a captured step swaps it for the target's routed kernel
    loop = from_dict({"kernels": {"moe": "loop"}})
    kernels, levers = planning_kernels(loop, MOE, target)
    assert kernels.moe == "loop" and not by_key(levers).get("kernels.moe")
    moe = by_key(mode_levers(loop, MOE, target, kernels, "default", "grouped_mm", mode="graph_trainer"))["kernels.moe"]
    assert (moe.recipe, moe.plan) == ("loop", "grouped_mm")


def test_a_dense_model_never_gets_kernels_moe():
    cfg = from_dict(EARNED)
    target = parse_target("v7x:64")
    kernels, levers = planning_kernels(cfg, DENSE, target)
    levers = merged(levers + mode_levers(cfg, DENSE, target, kernels, "default", "tokamax", mode="graph_trainer"))
    assert "kernels.moe" not in by_key(levers) and by_key(levers)["device.threads"].plan == 0


def test_a_cpu_target_keeps_what_this_cpu_measured():
    cfg = from_dict(EARNED)
    target = parse_target("cpu:1", cpu_memory=64 << 30, cpu_peak=2e11)
    kernels, levers = planning_kernels(cfg, MOE, target, twin_args=MOE_TWIN)
    got = by_key(levers)
    assert (kernels.moe, kernels.attention, kernels.loss) == ("dense", "naive", "plain")
    assert not got["kernels.moe"].changed and not got["device.threads"].changed
    shared = by_key(planning_kernels(cfg, MOE, parse_target("cpu:2", cpu_memory=64 << 30, cpu_peak=2e11))[1])
    assert shared["device.threads"].plan == 0  # two processes share the cores the count was tuned for


def test_the_plan_recipe_name_carries_the_sequence():
    plan = SimpleNamespace(target=parse_target("v7x:64"), seq_len=4096)
    assert recipe_name(plan) == "recipe.v7x-64.seq4096.toml"
    assert recipe_name(SimpleNamespace(target=parse_target("h100"), seq_len=512)) == "recipe.h100-1.seq512.toml"


runner = CliRunner()


def test_plan_warns_when_seq_exceeds_max_position_embeddings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["Qwen3-8B"][2]))  # 40960 positions
    made = runner.invoke(app, ["new-model", "q8", "--hf-config", str(tmp_path / "config.json"), "--dir",
                               str(tmp_path), "--device", "cpu", "--twin"])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    base = ["plan", "q8", "--dir", str(tmp_path), "--target", "v7x:64"]
    long = runner.invoke(app, [*base, "--seq", "65536", "--json"])
    out = json.loads(long.stdout)
    assert out["warnings"] and "--seq 65536 exceeds config.json's max_position_embeddings (40960)" in out["warnings"][0]
    assert f"warning: {out['warnings'][0]}" in long.stderr
    assert out["recipe"].endswith(f"recipe.v7x-64.seq{out['seq_len']}.toml")
    fine = runner.invoke(app, [*base, "--seq", "4096", "--json"])
    assert json.loads(fine.stdout)["warnings"] == [] and "warning" not in fine.stderr
