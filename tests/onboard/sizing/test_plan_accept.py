"""`onboard plan` writes only what titan_core runs: each candidate's recipe is judged by titan_core
(check_parallelism and the model-level checks, on meta), a refused one is never chosen, the plan lists
the refused ones with titan_core's reason, and when only refused layouts fit it picks another execution
mode titan_core runs or exits 1 saying why. Nothing here trains: models on meta, twins on disk.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.plan.hardware import HARDWARE
from onboard.sizing.plan.planner import HEADROOM, parse_target, plan_training
from onboard.sizing.plan.layout_memory import REGATHERING, device_memory
from onboard.sizing.plan.workspace import plan_workspace_target
from onboard.workspace.layout import Workspace
from plan_models import accepting
from real_size_configs import PUBLISHED
from titan_core.config import load_config
from titan_core.memory.estimate import ModelShape, TrainSetup
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import flops_per_token
from titan_core.models.registry import build_meta, get_family
from titan_core.parallel import check_parallelism

runner = CliRunner()
FUSED = TrainSetup(batch_size=1, seq_len=1, loss="fused_ce")
SEQ = 131072
EARNED = '\n[compile]\nenable = true\n\n[kernels]\nmoe = "dense"\n'  # what a ladder on this CPU leaves for an MoE


STAND_IN = "parallelism.cp > 1 refused (a stand-in refusal: titan_core runs every cp layout this plan lists)"


def _llama8b(memory_gib: float | None = None, *, refuse_cp: bool = False):
    """Llama 3.1 8B at 128k tokens on 64 H100s (their memory, or `memory_gib`), no TP plan: CP holds a
    sequence in far less memory than anything else. `refuse_cp`: titan_core's verdict with every cp > 1
    layout refused on top, to show what the plan does when only refused layouts fit."""
    args = get_family("llama3").flavors["8B"]
    meta = build_meta("llama3", args)
    ps, counts = ModelShape.from_model(meta, args), count_params(meta)
    target = parse_target("h100:64")
    if memory_gib is not None:
        target = replace(target, memory_bytes=int(memory_gib * 2**30 / HEADROOM))
    titan_core = accepting("llama3", "8B", target, FUSED)

    def accept(o):
        return STAND_IN if refuse_cp and o.layout.cp > 1 else titan_core(o)

    plan = plan_training(ps, counts, lambda s: flops_per_token(args, s), target, seq_len=SEQ, kernels=FUSED,
                         tp_plan=False, accept=accept)  # fmt: skip
    # titan_core's verdict on every option: the plan judged the fitting ones with this same `accept`
    peaks = [(device_memory(ps, o.layout, o.setup, batch=1).total, o, o.refused if o.fits else accept(o))
             for o in plan.options]  # fmt: skip
    return plan, peaks


def test_a_layout_titan_core_refuses_is_never_chosen():
    plan, peaks = _llama8b()
    c = plan.chosen
    assert c is not None and c.refused is None and c.layout.cp > 1 and c.compile  # CP compiles per block
    # titan_core's own refusals: pipeline stages sharded by FSDP2 (they are SimpleFSDP's), and SimpleFSDP's
    # re-gathering under per-block compile (its hooks see only an eager backward; the eager option stands)
    refused = [o for _, o, _ in peaks if o.fits and o.refused is not None]
    fsdp2_pp = [o for o in refused if o.layout.pp > 1 and o.data_parallel == "fsdp2"]
    compiled_regather = [o for o in refused if o.data_parallel == REGATHERING and o.compile]
    assert fsdp2_pp and compiled_regather and len(fsdp2_pp) + len(compiled_regather) == len(refused)
    assert all("needs data_parallel = 'simple_fsdp', not 'fsdp2'" in o.refused for o in fsdp2_pp)
    assert all("reshard_after_forward with per-block compile" in o.refused for o in compiled_regather)
    eager = [o for _, o, why in peaks if o.data_parallel == REGATHERING and not o.compile and o.fits]
    assert eager and all(o.refused is None for o in eager)
    summary = plan.to_dict()["refused"]
    assert summary["options"] == len(refused)
    assert sum(g["count"] for g in summary["reasons"]) == summary["options"]
    assert all(o.refused is None for o in plan.ranked())


def test_when_only_refused_layouts_fit_nothing_is_chosen_and_one_line_says_why():
    plan, peaks = _llama8b(refuse_cp=True)
    accepted = min(p for p, _, why in peaks if why is None)
    cheapest = min(p for p, _, why in peaks if why is not None)
    assert cheapest < accepted / 2  # CP over 16 ranks, against the best without CP
    none, _ = _llama8b((cheapest + accepted) / 2 / 2**30, refuse_cp=True)
    assert none.chosen is None and all(o.refused for o in none.options if o.fits)
    assert none.would_fit.startswith(f"nothing titan_core accepts fits --seq {SEQ} on 64 x h100: ")
    shorter = re.search(r"--seq (\d+) fits here", none.would_fit)
    assert STAND_IN in none.would_fit and shorter and int(shorter.group(1)) < SEQ


def _workspace(tmp_path, name: str, extra: str = "") -> str:
    ws = name.replace("-", "_").replace(".", "_").lower()
    (tmp_path / f"{ws}.json").write_text(json.dumps(PUBLISHED[name][2]))
    width = ["--twin-width", "64"] if name.startswith("Qwen") else []
    made = runner.invoke(app, ["new-model", ws, "--hf-config", str(tmp_path / f"{ws}.json"), "--dir", str(tmp_path),
                               "--device", "cpu", "--twin", *width])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    recipe = tmp_path / "onboarding" / ws / "recipe.toml"
    recipe.write_text(recipe.read_text() + extra)
    return ws


def test_onboard_plan_exits_1_naming_titan_cores_reason_when_only_refused_layouts_fit(tmp_path, monkeypatch):
    # a recipe whose attention kernel takes no explicit mask (flex): titan_core refuses it under CP
    ws = _workspace(tmp_path, "Llama-3.1-8B", '\n[kernels]\nattention = "flex"\n')
    plan, _ = plan_workspace_target(Workspace.load(tmp_path, ws), "h100:64", seq=SEQ)
    peak = [(device_memory(plan.shape, o.layout, o.setup, batch=1).total, o) for o in plan.options if o.fits]
    accepted = min(p for p, o in peak if o.refused is None)
    refused = min(p for p, o in peak if o.refused is not None)
    assert refused < accepted  # CP holds 128k tokens in less
    between = int((refused + accepted) / 2 / HEADROOM)
    monkeypatch.setitem(HARDWARE, "h100", replace(HARDWARE["h100"], memory_bytes=between))
    root = tmp_path / "onboarding" / ws
    # the one line goes to stderr under --json too (without it stdout stays empty: test_plan_parallel's
    # test_nothing_fits_exits_1_with_one_line_and_keeps_the_seq runs that path)
    res = runner.invoke(app, ["plan", ws, "--dir", str(tmp_path), "--target", "h100:64", "--seq", str(SEQ), "--json"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: nothing titan_core accepts fits --seq {SEQ} on 64 x h100: ")
    assert "kernels.attention = 'flex' cannot run under parallelism.cp" in lines[0]
    assert not list(root.glob("recipe.h100-*.toml"))
    out = json.loads(res.stdout)
    assert f"error: {out['error']}" == lines[0]
    assert out["chosen"] is None and out["options_accepted"] == 0 and out["refused"]["options"] > 0
    assert all(g["reason"] and g["count"] and g["layouts"] for g in out["refused"]["reasons"])


def test_pp_is_chosen_with_checkpoints_and_validation_and_dropped_for_a_feature_it_refuses(tmp_path):
    # Qwen3-30B-A3B at 4k tokens on 32 H100s: a 4-stage pipeline predicts the most tokens/s
    ws = _workspace(tmp_path, "Qwen3-30B-A3B", EARNED)
    res = runner.invoke(app, ["plan", ws, "--dir", str(tmp_path), "--target", "h100:32", "--json"])
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["degrees"]["pp"] > 1 and out["chosen"]["mode"] == "compile"  # the stages' blocks compiled
    # pp saves and resumes DCP checkpoints and validates: not among what it refuses; the HF export still is
    assert "checkpoint.enable" not in out["refused_features"] and "validation.enable" not in out["refused_features"]
    assert "does not support checkpoint.export_hf" in out["refused_features"]["checkpoint.export_hf"]
    assert "a run of this recipe runs without them" in out["degrees_why"]["pp"]
    levers = {lv["key"]: lv for lv in out["levers"]}  # the recipe's per-block compile, kept with the pipeline
    assert levers["compile.enable"]["plan"] is True and not levers["compile.enable"]["changed"]
    cfg = load_config(out["recipe"])
    assert cfg.compile.enable and cfg.parallelism.pp == out["degrees"]["pp"]
    check_parallelism(cfg, 32)  # titan_core runs what was written
    recipe = tmp_path / "onboarding" / ws / "recipe.toml"
    # a recipe that saves checkpoints keeps its pipeline
    recipe.write_text(recipe.read_text() + "\n[checkpoint]\nenable = true\n")
    res = runner.invoke(app, ["plan", ws, "--dir", str(tmp_path), "--target", "h100:32", "--json", "--force"])
    assert res.exit_code == 0, res.stderr
    saving = json.loads(res.stdout)
    assert saving["degrees"]["pp"] == out["degrees"]["pp"] and "checkpoint.enable" not in saving["refused_features"]
    cfg = load_config(saving["recipe"])
    assert cfg.checkpoint.enable and check_parallelism(cfg, 32).pp == out["degrees"]["pp"]
    # one that exports does not (titan_core refuses the HF export under pp): then no pipeline, and the plan says why
    recipe.write_text(recipe.read_text().replace("[checkpoint]\nenable = true\n",
                                                 '[checkpoint]\nenable = true\nexport_hf = "hf"\n'))
    res = runner.invoke(app, ["plan", ws, "--dir", str(tmp_path), "--target", "h100:32", "--json", "--force"])
    assert res.exit_code == 0, res.stderr
    exporting = json.loads(res.stdout)
    assert exporting["degrees"]["pp"] == 1 and "checkpoint.export_hf" not in exporting["refused_features"]
    assert "does not support checkpoint.export_hf" in exporting["degrees_why"]["pp"]
    cfg = load_config(exporting["recipe"])
    assert cfg.checkpoint.export_hf.endswith("hf") and check_parallelism(cfg, 32).pp == 1
