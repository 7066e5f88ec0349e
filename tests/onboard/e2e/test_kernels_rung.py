"""The kernels rung: real comparisons on narrowed llama3, glimmer and qwen3_moe debug workspaces,
a broken kernel failing the gate by name, and the engine writing the kept kernels into recipe.toml
only on a pass, making the earlier rungs that train with the recipe's kernels re-verify (parity,
which reads only [model], keeps its evidence), while a hand edit makes every rung stale. The keep
rule itself, on scripted numbers, is tests/onboard/rungs/test_kernels_keep_rule.py.

To stay fast on a 2-core machine each preset's config.json is narrowed (every feature kept: GQA,
sliding windows, soft-cap, tied weights, experts; one or two layers of width 64, vocab 256), the
recipe runs 4 x 32 tokens on one intra-op thread, and tests that are not about timing replace the
whole-step timing (kernels_steps.WholeSteps) with scripted numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
from pathlib import Path

import pytest
import yaml
from ladder_fakes import CHECKLISTS, FakeRung
from timing_checks import check_comparison

from onboard.workspace.fsutil import sha256_file
from onboard.ladder.gates import evaluate, gate_passed, load_checklist, parse_checklist
from onboard.ladder.table import RUNGS, TABLE, RungSpec
from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.report.write import write_report
from onboard.rungs.kernels_rung import rung as kernels
from onboard.rungs.kernels_rung import steps as kernels_steps
from onboard.ladder.decision import KEPT
from onboard.ladder.contract import RecipeEdit, RungContext, settle_runs
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.cli.views import show_outcome
from onboard.workspace.layout import Workspace
from titan_core.measure.timing import compare
from titan_core.kernels.float8 import FLOAT8_LOSS_REL
from titan_core.kernels.fused_ce import FusedCrossEntropyHead
from onboard.rungs.kernels_rung.compare import KERNEL_FLAGS, parse_flag
from titan_core.models.common.attention import SDPAttention

HAS_JAX = all(importlib.util.find_spec(m) for m in ("jax", "tokamax"))
NARROW = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=256)  # fmt: skip
PRESETS = {
    "llama3": ("llama3/debugmodel", {}),
    # one sliding and one global layer, a window shorter than the sequence, the soft-cap and qk-norm kept
    "glimmer": (
        "glimmer/debugmodel",
        {
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 16,
            "no_rope_layer_interval": 2,
        },
    ),
    "qwen3_moe": ("qwen3_moe/debugmodel", {"num_experts": 4, "moe_intermediate_size": 32}),
}
MOE_FLAGS = [f for f in KERNEL_FLAGS if f.startswith("kernels.moe=")]


def narrowed_workspace(base: Path, family: str, *, path: str | None = None) -> Workspace:
    """`new-model --preset <family>/debugmodel`, narrowed, 4 x 32 tokens on one thread."""
    preset, extra = PRESETS[family]
    write_workspace(plan_workspace(family, base, preset=preset, device="cpu", path=path))
    ws = Workspace.load(base, family)
    cfg_path = ws.root / "config.json"
    config = json.loads(cfg_path.read_text())
    narrow = {**NARROW, **extra}
    assert set(narrow) <= set(config), f"the preset's config.json lost {set(narrow) - set(config)}"
    cfg_path.write_text(json.dumps({**config, **narrow}, indent=2))
    text = ws.recipe_path.read_text()
    for old, new in (("seq_len = 128", "seq_len = 32"), ('type = "cpu"', 'type = "cpu"\nthreads = 1')):
        assert old in text, f"{old!r} not in the recipe template any more"
        text = text.replace(old, new)
    ws.recipe_path.write_text(text)
    return ws


def run_rung(ws: Workspace, tmp_path: Path, lines: list | None = None):
    attempt = tmp_path / "attempt"
    attempt.mkdir(exist_ok=True)
    log = lines.append if lines is not None else (lambda line: None)
    ctx = RungContext(workspace=ws, attempt_dir=attempt, evidence={}, log=log)
    result = kernels.run(ctx)
    settle_runs(result.measurements, ctx.runs)  # as the engine does
    return result


def timing(w: float, wo: float) -> dict:
    """The timing protocol's answer for two steady step times (no noise: the interval is a point)."""
    return compare(lambda: w, lambda: wo, kernels.protocol()).to_dict()


def scripted_steps(monkeypatch, times: dict[tuple[str, str, str], tuple[float, float]]) -> None:
    """Whole steps -> (candidate's step time, the other side's) per (field, candidate, against);
    default: the candidate slower (never taken by speed, nor by memory)."""

    class Scripted:
        def __init__(self, ctx, proto):
            self.built, self.trainers, self.mode = 0, {}, "scripted"

        def compare(self, field_name, candidate, against):
            w, wo = times.get((field_name, candidate, against), (2.0, 1.0))
            return {**timing(w, wo), "describe": f"scripted {w} vs {wo}"}

        def close(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(kernels_steps, "WholeSteps", Scripted)


def assert_decisions_follow_the_rule(result) -> None:
    """Recompute every field's value from the decisions the rung recorded: the recipe holds a
    candidate only with a kept decision, and every row's `kept` says what the recipe holds."""
    rows, choices = result.details["kernels"], result.details["field_choices"]
    decisions = result.details["decisions"]
    edits = {e.key: e.value for e in result.recipe_edits}
    for field_name, choice in choices.items():
        mine = [d for d in decisions if d["lever"] == f"kernels.{field_name}"]
        kept = {d["candidate"] for d in mine if d["verdict"] == KEPT}
        assert kept <= {choice["value"]}, (field_name, kept, choice)
        assert choice["edit"] == (choice["value"] != choice["was"]) and (not choice["edit"] or kept)
        assert edits.get(f"kernels.{field_name}") == (choice["value"] if choice["edit"] else None)
        assert all(d["value"] == choice["value"] and d["rung"] == "kernels" for d in mine)
        for d in mine:  # a speed decision keeps only on `faster`, and its interval says so
            if d["figure"] == "speed" and d["verdict"] == KEPT:
                assert d["outcome"] == "faster" and d["ci"][0] > 1
        for c in choice["contests"]:
            check_comparison(c["timing"], kernels.protocol().min_effect)
    for flag, r in rows.items():
        if r["status"] == "not_applicable":
            continue
        field_name, value = parse_flag(flag)
        assert r["kept"] == (choices[field_name]["value"] == value), flag
        assert r["why"].startswith("kept" if r["kept"] else "not kept"), flag


def test_compare_shape_caps_tokens_and_says_so():
    assert kernels.compare_shape(4, 128) == (4, 128, "the recipe's batch_size x seq_len")
    b, s, why = kernels.compare_shape(8, 4096)
    assert (b, s) == (1, 4096) and "capped at 4096" in why
    b, s, _ = kernels.compare_shape(2, 8192)
    assert (b, s) == (1, 4096)


def test_tolerance_comes_from_the_checklist_and_nan_fails():
    criteria = kernels.tolerances()
    assert {c.threshold for c in criteria.values()} == {1e-5} and set(criteria) == set(kernels.ERROR_METRICS)
    ok = {"loss_rel_err": 1e-5, "logits_rel_err": 0.0, "max_grad_rel_err": 3e-6}
    assert kernels.within_tolerance(ok, criteria)
    assert not kernels.within_tolerance({**ok, "max_grad_rel_err": 1.1e-5}, criteria)
    assert not kernels.within_tolerance({**ok, "logits_rel_err": math.nan}, criteria)


# ---- the rung on the three debug workspaces ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", list(PRESETS))
def test_rung_passes_on_narrowed_debug_workspaces(tmp_path, family):
    ws = narrowed_workspace(tmp_path, family)
    lines: list[str] = []
    result = run_rung(ws, tmp_path, lines)
    m, rows = result.measurements, result.details["kernels"]
    results = evaluate(load_checklist("kernels"), m)
    assert gate_passed(results), [r for r in results if not r["ok"]]
    assert list(rows) == list(KERNEL_FLAGS) and "skipped" not in json.dumps(result.details)
    compared = [f for f, r in rows.items() if r["status"] == "compared"]
    assert {"kernels.loss=fused_ce", "kernels.attention=sdpa"} <= set(compared)
    assert ("kernels.attention=tokamax" in compared) == HAS_JAX
    assert "no backward on CPU" in rows["kernels.attention=flex"]["reason"]
    assert "TPU kernel" in m["attention_splash_not_applicable"]
    if family == "qwen3_moe":
        assert {"kernels.moe=dense", "kernels.moe=grouped_mm"} <= set(compared)
    else:  # the MoE kernels on a dense model: not applicable, with the reason
        assert all("dense model" in rows[f]["reason"] for f in MOE_FLAGS)
        assert all(f"{f[8:].replace('=', '_')}_not_applicable" in m for f in MOE_FLAGS)
    assert m["kernels_compared"] == len(compared) and m["kernels_raised"] == 0
    assert (m["compare_batch_size"], m["compare_seq_len"], m["compare_dtype"]) == (4, 32, "float32")
    choices = result.details["field_choices"]
    timed = [f for f in compared if "timing" in rows[f]]
    for f in timed:  # whole steps against the recipe's value; the outcome follows from the interval
        t, (field_name, _) = rows[f]["timing"], parse_flag(f)
        assert rows[f]["timed_against"] == choices[field_name]["was"]
        assert rows[f]["step_time_s"] == t["candidate_median_s"]
        assert rows[f]["holder_step_time_s"] == t["baseline_median_s"]
        check_comparison(t, kernels.protocol().min_effect)
        assert t["rounds"] >= kernels.protocol().min_rounds
    # every kernel that passed was timed, except the one the recipe holds (never against itself)
    held = {f"kernels.{f}={c['was']}" for f, c in choices.items()}
    assert set(timed) == {f for f in compared if rows[f]["eligible"] and f not in held}
    assert m["whole_step_trainers"] >= 2
    assert_decisions_follow_the_rule(result)
    assert {p.name for p in result.files_read} == {"recipe.toml", "config.json", "adapter.py"}
    assert sum(line.startswith("kernels: kernels.") for line in lines) >= len(KERNEL_FLAGS)
    check_float8_on_cpu(result)


def check_float8_on_cpu(result) -> None:
    """float8 among the candidates: each recipe checked against the bf16 recipe within titan_core's
    bounds, timed on whole steps against float8 = none, and held: CPU runs torchao's emulation."""
    m, rows = result.measurements, result.details["kernels"]
    assert m["float8_checked"] == 2 and m["float8_loss_rel_bound"] == FLOAT8_LOSS_REL
    # the recipe holds no float8 after the rung, so the gate's float8 errors are of no float8: 0
    assert m["worst_float8_loss_rel"] == 0.0 == m["worst_float8_layer_over_bound"]
    for flag in ("kernels.float8=tensorwise", "kernels.float8=rowwise"):
        row = rows[flag]
        assert 0 < row["loss_rel"] and 0 < row["layer_over_bound"] <= 1
        assert (row["status"], row["passed"], row["eligible"], row["emulated"]) == ("compared", True, True, True), row
        # the block linears converted, never the output head (glimmer's is tied to the embedding: no module)
        assert row["converted"] and all(p.startswith("layers.") for p in row["converted"])
        assert row["precision"] == "bf16"
        assert all(why.startswith(("output head", "MoE router")) for why in row["unconverted"].values())
        assert row["loss_rel"] <= row["loss_bound"] == FLOAT8_LOSS_REL
        assert row["timed_against"] == "none" and row["holder_step_time_s"] > 0 and row["step_time_s"] > 0
        check_comparison(row["timing"], kernels.protocol().min_effect)
        # emulation is never faster, so never kept; where it converts few linears (the MoE model's
        # experts stay bf16) the slowdown can sit inside the interval: indistinguishable
        assert row["outcome"] in ("slower", "indistinguishable", "not measured"), row["outcome"]
        assert row["kept"] is False and row["reason"]
    assert result.details["field_choices"]["float8"]["value"] == "none"
    assert "kernels.float8" not in {e.key for e in result.recipe_edits}


@pytest.mark.slow
def test_a_broken_kernel_fails_the_gate_and_is_named(tmp_path, monkeypatch):
    right = SDPAttention.forward
    monkeypatch.setattr(SDPAttention, "forward", lambda self, *a, **k: right(self, *a, **k) * (1 + 1e-3))
    scripted_steps(monkeypatch, {("attention", "sdpa", "naive"): (0.1, 1.0)})  # fast, but wrong: never held
    ws = narrowed_workspace(tmp_path, "llama3")
    result = run_rung(ws, tmp_path)
    m, row = result.measurements, result.details["kernels"]["kernels.attention=sdpa"]
    failed = {r["name"]: r for r in evaluate(load_checklist("kernels"), m) if not r["ok"]}
    assert {"logits", "grads"} <= set(failed) and "every_kernel_ran" not in failed
    assert m["worst_kernel"] == m["worst_logits_kernel"] == m["worst_grad_kernel"] == "kernels.attention=sdpa"
    assert m["worst_logits_rel_err"] > 1e-4 and m["worst_grad_param"]
    assert "worst_logits_kernel" in failed["logits"]["hint"] and "worst_grad_param" in failed["grads"]["hint"]
    assert row["passed"] is False and row["kept"] is False and "step_time_s" not in row
    attention = result.details["field_choices"]["attention"]
    assert (attention["was"], attention["value"]) == ("sdpa", "naive")  # the plain path, for that reason
    assert "fp32" in attention["why"] and "not by timing" in attention["why"]


@pytest.mark.slow
def test_a_kernel_that_raises_fails_every_kernel_ran(tmp_path, monkeypatch):
    def boom(self, *a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(FusedCrossEntropyHead, "forward", boom)
    scripted_steps(monkeypatch, {})
    result = run_rung(narrowed_workspace(tmp_path, "llama3"), tmp_path)
    m = result.measurements
    failed = {r["name"] for r in evaluate(load_checklist("kernels"), m) if not r["ok"]}
    assert {"every_kernel_ran", "loss", "logits", "grads"} == failed  # a kernel that did not run matched nothing
    assert m["kernels_raised"] == 1 and m["worst_kernel"] == "kernels.loss=fused_ce"
    assert m["kernels_compared"] >= 1  # the others still ran
    assert "kernel exploded" in result.details["kernels"]["kernels.loss=fused_ce"]["error"]


@pytest.mark.slow
def test_a_port_builds_its_models_from_its_own_model_file(tmp_path):
    ws = narrowed_workspace(tmp_path, "llama3", path="port")
    assert ws.path_kind == "port"
    counter = ws.root / "built.txt"
    with open(ws.root / "model.py", "a") as f:  # count the port's builds, from inside the port
        f.write(
            "\n\n_port_build = build_model\n\n\ndef build_model(args):\n"
            f"    with open({str(counter)!r}, 'a') as out:\n        out.write('x')\n    return _port_build(args)\n"
        )
    result = run_rung(ws, tmp_path)
    assert gate_passed(evaluate(load_checklist("kernels"), result.measurements))
    # two models per comparison (float8: one on meta to list its linears, one for its layer check),
    # one per step peak measured, one per whole-step trainer and per run of the float8 check, every
    # one of them from the port's model.py; one more, on the meta device, to ask which swaps the
    # port's modules can take, and one for the recipe's whole run with the kernels kept
    m = result.measurements
    peaks = sum(p is not None for p in result.details["peaks"].values())
    float8_runs = m["float8_checked"] + 1  # each float8 recipe's bf16 run and the one without float8
    trainers = m["whole_step_trainers"] + float8_runs
    assert len(counter.read_text()) == 1 + 2 * m["kernels_compared"] + peaks + trainers + 1
    assert result.details["path"] == "port" and "model.py" in {p.name for p in result.files_read}


# ---- through the engine ------------------------------------------------------------------------


def ladder_specs() -> list[RungSpec]:
    """Fake eager/parity/simple_fsdp that pass, the real kernels rung and checklist; the rest not built."""
    out = []
    for rung in RUNGS:
        if rung in ("eager", "parity", "simple_fsdp"):
            data = dict(CHECKLISTS["eager"], rung=rung)
            checklist = parse_checklist(yaml.safe_load(yaml.safe_dump(data)), f"fake {rung}")
            out.append(RungSpec(rung, None, module=FakeRung(rung, {"score": 2.0, "flag": True}), checklist=checklist))
        elif rung == "kernels":
            out.append(RungSpec(rung, "onboard.rungs.kernels_rung.rung"))
        else:
            out.append(RungSpec(rung, None))
    return out


def statuses(ws: Workspace, sp) -> dict[str, str]:
    return {s.rung: s.status for s in ladder_states(Workspace.load(ws.root.parent.parent, ws.name), sp)}


@pytest.mark.slow
def test_engine_edits_the_recipe_only_on_a_pass_and_re_verifies_the_rungs_that_read_it(tmp_path, monkeypatch):
    ws = narrowed_workspace(tmp_path, "llama3")
    sp = ladder_specs()
    sp[1].module.reads_recipe_key = lambda key: key.startswith("model.")  # as the real parity rung
    for rung in ("eager", "parity", "simple_fsdp"):
        assert next_step(Workspace.load(tmp_path, ws.name), specs=sp).status == "passed"
    # fused_ce "faster" would be kept, but a broken sdpa fails the gate: nothing is written
    scripted_steps(monkeypatch, {("loss", "fused_ce", "plain"): (0.5, 1.0)})
    right = SDPAttention.forward
    monkeypatch.setattr(SDPAttention, "forward", lambda self, *a, **k: right(self, *a, **k) * (1 + 1e-3))
    before = ws.recipe_path.read_bytes()
    failed = next_step(Workspace.load(tmp_path, ws.name), specs=sp)
    assert (failed.rung, failed.status) == ("kernels", "failed")
    assert ws.recipe_path.read_bytes() == before and "recipe_edit" not in failed.entry
    # proposed (fused_ce "faster"; attention back to naive, sdpa being wrong), and not applied
    assert failed.entry["measurements"]["proposed_recipe_edits"] == ["kernels.loss=fused_ce", "kernels.attention=naive"]

    monkeypatch.setattr(SDPAttention, "forward", right)
    passed = next_step(Workspace.load(tmp_path, ws.name), specs=sp)
    assert (passed.rung, passed.attempt, passed.status) == ("kernels", 2, "passed"), passed.criteria
    text = ws.recipe_path.read_text()
    assert text.startswith(before.decode())  # every line the person had is still there
    assert '\n[kernels]\nloss = "fused_ce"  # kernels rung: matches loss=plain' in text
    edit = passed.entry["recipe_edit"]
    assert edit["file"] == "recipe.toml" and edit["sha256_before"] == hashlib.sha256(before).hexdigest()
    assert edit["sha256_after"] == sha256_file(ws.recipe_path) == passed.entry["files_read"]["recipe.toml"]
    assert [e["key"] for e in edit["edits"]] == ["kernels.loss"] and passed.to_json()["recipe_edit"] == edit
    st = statuses(ws, sp)
    # eager and simple_fsdp train with the recipe's kernels: fused_ce is a combination they have not
    # run, so they re-verify; parity reads only [model]; the kernels evidence is the edited recipe's
    assert [st[r] for r in ("eager", "parity", "simple_fsdp", "kernels")] == ["stale", "passed", "stale", "passed"]
    assert "recipe.toml" in {s.rung: s for s in ladder_states(Workspace.load(tmp_path, ws.name), sp)}["eager"].reason

    printed: list = []
    show_outcome(printed.append, passed)
    assert any(str(p).startswith('recipe.toml: kernels.loss = "fused_ce" (kernels rung: matches') for p in printed)
    report = write_report(Workspace.load(tmp_path, ws.name), sp).read_text()
    assert "Recipe edits (`recipe.toml`" in report and '`"fused_ce"`' in report

    # a hand edit after the rung's edit: every rung that read the recipe is stale
    ws.recipe_path.write_text(text.replace('loss = "fused_ce"', 'loss = "plain"'))
    st = statuses(ws, sp)
    assert [st[r] for r in ("eager", "parity", "simple_fsdp", "kernels")] == ["stale"] * 4


def test_an_edit_that_cannot_be_applied_fails_the_attempt(debug_ws, monkeypatch):
    # the eager rung earns no key: give it the kernels section, so the edit reaches the writer
    monkeypatch.setitem(TABLE, "eager", dataclasses.replace(TABLE["eager"], earns=frozenset({"kernels.*"})))

    class Editing(FakeRung):
        def run(self, ctx):
            result = super().run(ctx)
            result.recipe_edits = [RecipeEdit("kernels.loss", {"not": "toml"}, "bad")]
            return result

    sp = ladder_specs()
    sp[0].module = Editing("eager", {"score": 2.0, "flag": True})  # the gate passes; its edit cannot be written
    before = debug_ws.recipe_path.read_bytes()
    out = next_step(debug_ws, specs=sp)
    assert out.status == "failed" and "recipe edit failed, recipe.toml unchanged" in out.entry["error"]
    assert debug_ws.recipe_path.read_bytes() == before and "recipe_edit" not in out.entry


@pytest.mark.slow
def test_a_kernel_is_judged_in_the_recipes_execution_mode(tmp_path, monkeypatch):
    """fused_ce "faster" and equal to the plain loss, but breaking the compiled loss head: the recipe
    trains with per-block compile, so it is not kept, and the reason says so."""
    ws = narrowed_workspace(tmp_path, "llama3")
    with open(ws.recipe_path, "a") as f:
        f.write("\n[compile]\nenable = true\n")
    right = FusedCrossEntropyHead.forward

    def breaking(self, hidden, weight, labels):
        hidden = hidden * 1.0
        labels.tolist()  # host data inside the kernel: a graph break under torch.compile
        return right(self, hidden, weight, labels)

    monkeypatch.setattr(FusedCrossEntropyHead, "forward", breaking)
    scripted_steps(monkeypatch, {("loss", "fused_ce", "plain"): (0.5, 1.0)})
    result = run_rung(ws, tmp_path)
    row = result.details["kernels"]["kernels.loss=fused_ce"]
    assert result.measurements["execution_mode"] == "compile" and row["passed"] is True
    assert row["kept"] is False and "execution mode" in row["reason"] and "graph-breaks" in row["reason"]
    assert row["mode_check"]["graph_breaks"] >= 1 and "step_time_s" not in row  # never timed
    assert result.details["field_choices"]["loss"]["value"] == "plain"


@pytest.mark.slow
def test_grouped_mm_in_fp32_is_rejected_under_compile_with_the_reason(tmp_path, monkeypatch):
    """kernels.moe = grouped_mm equals the loop in fp32 eager, but torch.compile's grouped matmul
    takes bf16 only: in an fp32 recipe that compiles it does not apply, with that reason, is never
    timed, and the recipe does not get it."""
    ws = narrowed_workspace(tmp_path, "qwen3_moe")
    with open(ws.recipe_path, "a") as f:
        f.write("\n[compile]\nenable = true\n")
    scripted_steps(monkeypatch, {("moe", "grouped_mm", "loop"): (0.5, 1.0)})  # "faster": only the mode stops it
    result = run_rung(ws, tmp_path)
    row = result.details["kernels"]["kernels.moe=grouped_mm"]
    assert result.measurements["execution_mode"] == "compile"
    assert row["status"] == "not_applicable" and "bf16 only under torch.compile" in row["reason"], row
    assert "step_time_s" not in row and not row.get("kept")
    assert result.details["field_choices"]["moe"]["value"] != "grouped_mm"
