"""`onboard demo`: the whole ladder on the llama3 debugmodel, through the console script.

The demo climbs in the background from the start of the session (tests/background.py, started
by tests/conftest.py) and this test runs last, so the rest of the suite runs beside it."""

import json
import subprocess
import sys
from pathlib import Path

import tomllib

import background
import pytest
from demo_train_checks import check_train_stage
from hang_guard import Load, hang_guard, stretch
from headlines import check_headlines
from ledger_paths import assert_every_named_path_exists
from onboard.ladder import contract
from onboard.rungs import gate_recipe, timing_profiles
from onboard.ladder.table import default_specs
from onboard.workspace.ledger import json_safe
from titan_core.measure.numerics import rel

ONBOARD = Path(sys.executable).parent / "onboard"


@pytest.mark.slow
def test_demo_climbs_every_built_rung_and_prints_the_ladder(tmp_path):
    demo, result, wall = background.wait("demo")
    guard = demo.guard()
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "demo ladder: llama3_debug" in out
    built = [spec.name for spec in default_specs() if spec.built]
    assert built[:3] == ["eager", "parity", "simple_fsdp"]
    for i, rung in enumerate(built, start=1):
        row = next(r for r in out.splitlines() if r.startswith(f"│ {i} │ {rung}"))
        assert "passed" in row, row
    assert "skipped" not in out
    assert built[-1] == "tuning" and "ladder complete: every rung passed or does not apply" in out
    assert "report.html:" in out and "waterfall:" in out
    ws = demo.base / "demo" / "onboarding" / "llama3_debug"
    ledger = json.loads((ws / "ladder.json").read_text())
    # every attempt passed; a rung's recipe edit may have sent the ladder round again to re-verify
    assert {e["status"] for e in ledger["attempts"]} == {"passed"}
    # alone, the demo's decisions were timed with the checklists' own protocol (`make demo`'s run);
    # beside the suite with the quick profile over it (background.demo_timing); every timed entry says which
    profile = background.demo_timing(demo.shared)
    timed = [e for e in ledger["attempts"] if "timing" in gate_recipe.checklist(e["rung"]).params]
    assert {e["rung"] for e in timed} == {"simple_fsdp", "graph_trainer", "kernels", "tuning"}
    for e in timed:
        protocol = json_safe(timing_profiles.timing_params(e["rung"], profile))
        assert (e["details"]["timing_profile"], e["details"]["timing_protocol"]) == (profile, protocol), e["rung"]
    if profile != contract.SHIPPED:
        assert f"timed with the {profile} profile" in demo.stderr.read_text()  # its log (the result holds its tail)
        assert f"| timing profile | {profile}: **shortened, not the checklist's protocol**" in (ws / "REPORT.md").read_text()
    rungs = [e["rung"] for e in ledger["attempts"]]
    assert sorted(set(rungs), key=rungs.index) == built  # first reached in ladder order, every one
    assert_sharded_step_is_the_eager_evidence(ledger)
    assert_every_rung_ran_whole_and_names_its_bounds_precision(ledger)
    for rung in built:
        assert f"## {rung}: passed" in (ws / "REPORT.md").read_text()
    check_headlines(ws)  # REPORT.md's and status's headline figures are the ledger's decision figures
    assert_every_named_path_exists(ws)  # every metrics file, log and trace the ledger points to is on disk
    # after the ladder, the proved recipe trained "your" checkpoint on "your" data and its export reloads
    check_train_stage(demo.base / "demo", out)
    # no flip: the climb reached the top in at most twice as many next-step calls as there are rungs
    assert len(ledger["attempts"]) <= 2 * len(built), [e["rung"] for e in ledger["attempts"]]
    # 300 s is the demo's budget on a machine with a core per runnable process when it starts (its
    # own ranks load it up to that); how much slower a loaded one runs it is not the load average's
    # ratio (1,669 s at load 8 on 2 cores), so there the scaled hang guard is the only bound; nor is
    # it when the demo climbed beside the rest of the suite (`pytest tests/onboard/e2e/test_demo.py`
    # alone gives it the machine)
    end = Load.now()
    if stretch(guard.start) == 1 and not demo.shared:
        assert wall < 300, f"demo took {wall:.0f} s; {guard.start.describe()} at start, {end.describe()} at end"
    else:
        waited = max(0.0, wall - (demo.waiting_since - demo.started))
        where = "on a loaded machine"
        if demo.shared:
            where = f"beside the rest of the suite (its test waited {waited:.0f} s; paused {demo.paused_s:.0f} s)"
        print(f"demo took {wall:.0f} s {where}: {guard.start.describe()} at start, {end.describe()} at end")
    assert_train_reproduces_the_verified_step(ws, ledger, tmp_path / "train")
    assert_ladder_speedup_reads_the_ledger(ws, ledger)


def assert_ladder_speedup_reads_the_ledger(ws: Path, ledger: dict) -> None:
    """bench/ladder_speedup.py runs on the workspace the demo left (its ledger's decisions are Decision
    records): the baseline restores every key a rung edited from what that rung recorded, none assumed,
    and its three pairs are timed (two rounds each: a smoke run, the figures are the bench's to make)."""
    bench = Path(__file__).resolve().parents[3] / "bench" / "ladder_speedup.py"
    run = subprocess.run([sys.executable, str(bench), str(ws), "--warmup-rounds=0", "--max-rounds=2"],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    edited = {e["key"] for a in ledger["attempts"] for e in (a.get("recipe_edit") or {}).get("edits", [])}
    assert set(report["baseline"]["restored"]) == edited and report["baseline"]["assumed_default"] == {}
    assert set(report["ratios"]) == {"baseline_vs_hf", "final_vs_baseline", "final_vs_hf"}
    assert all(c["rounds"] == 2 and c["paired"] for c in report["comparisons"])


def assert_sharded_step_is_the_eager_evidence(ledger: dict) -> None:
    """llama3 has no per-forward aux loss: simple_fsdp's first baseline is the eager rung's evidence
    itself, and its errors are the distances to those very numbers (test_simple_fsdp_e2e.py has the
    MoE's grad-accum baseline and a wrong reduce failing). The first attempts: a re-verification after
    the rung kept bf16 params compares with one fp32 process instead (its eager evidence is not fp32)."""
    first = {}
    for e in ledger["attempts"]:
        first.setdefault(e["rung"], e)
    eager, m = first["eager"]["measurements"], first["simple_fsdp"]["measurements"]
    assert m["baseline"] == "eager evidence" and m["world_size"] == 2
    assert m["baseline_step1_loss"] == eager["step1_loss"]
    assert m["baseline_step1_grad_norm"] == eager["step1_grad_norm"]
    assert m["step1_loss_rel_err"] == rel(m["step1_loss"], eager["step1_loss"]) <= 1e-6
    assert m["step1_grad_norm_rel_err"] == rel(m["step1_grad_norm"], eager["step1_grad_norm"])
    assert m["step1_grad_norm_rel_err"] <= 1e-6
    assert set(first["simple_fsdp"]["files_read"]) == {"recipe.toml", "config.json", "adapter.py"}


def assert_every_rung_ran_whole_and_names_its_bounds_precision(ledger: dict) -> None:
    """Every training rung's runs did every planned step finite, and each comparison of two runs of
    the recipe was judged by the bound of the precision the recipe held then (bf16 when the noise
    let simple_fsdp keep bf16 params: then the eager rung's own bf16 bound, test_bf16_ladder.py)."""
    for e in ledger["attempts"]:
        if e["rung"] == "parity":
            continue
        m = e["measurements"]
        assert m["runs_whole"] is True and m["runs_recorded"] >= 1, (e["rung"], m.get("runs_not_whole"))
        for c in e["criteria"]:
            if c["name"] in ("step1_loss", "final_step1_loss") and e["rung"] in ("compile", "tuning"):
                assert c["precision"] == m["precision"] and c["bound_why"], (e["rung"], c)
                bf16 = m["precision"] == "bf16"
                assert c["threshold_ref"] == ("evidence.eager.bf16_rounding_bound" if bf16 else None), c


def assert_train_reproduces_the_verified_step(ws: Path, ledger: dict, out: Path) -> None:
    """`onboard train` with the final recipe runs the combination the gates verified: its step-1
    loss is the record of the tuning rung's whole run of the final recipe (or, before tuning, of
    the rung that ran the recipe's execution mode), to the compile gate's tolerance when the
    recipe compiles (compiled kernels round differently from run to run), else exactly."""
    recipe = tomllib.loads((ws / "recipe.toml").read_text())
    latest = {e["rung"]: e for e in ledger["attempts"]}
    compiled = recipe.get("compile", {}).get("enable")
    judged = next(c for c in latest["compile"]["criteria"] if c["name"] == "step1_loss")
    tolerance = judged["threshold"] if compiled else 0.0  # the bound the compile gate judged this recipe by
    if (latest.get("tuning") or {}).get("measurements", {}).get("step1_loss") is not None:
        reference = latest["tuning"]["measurements"]["step1_loss"]
    elif compiled:
        reference = latest["compile"]["measurements"]["step1_loss"]
    else:  # eager, or the Graph Trainer uncompiled: bit-identical to the eager rung's step
        reference = latest["eager"]["measurements"]["step1_loss"]
    argv = [ONBOARD, "train", "--config", ws / "recipe.toml", "--training.steps=2", f"--metrics.output_dir={out}"]
    with hang_guard(300, "onboard train (the final recipe, 2 steps)") as guard:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=guard.timeout_s)
    assert result.returncode == 0, result.stdout + result.stderr
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert rel(first["loss"], reference) <= tolerance, (first["loss"], reference, recipe)
