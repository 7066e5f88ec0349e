"""The kernels rung: real comparisons on narrowed llama3, glimmer and qwen3_moe debug workspaces,
the keep rule on synthetic numbers (its edges included, timings through the one timing protocol), a broken kernel failing the gate by name,
and the engine writing the kept kernels into recipe.toml only on a pass, making the earlier rungs
that train with the recipe's kernels re-verify (parity, which reads only [model], keeps its evidence),
while a hand edit makes every rung stale.

To stay fast on a 2-core machine each preset's config.json is narrowed (every feature kept: GQA,
sliding windows, soft-cap, tied weights, experts; one or two layers of width 64, vocab 256), the
recipe runs 4 x 32 tokens on one intra-op thread, and tests that are not about timing replace
`measure_kernel` with scripted numbers.
"""

from __future__ import annotations

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
from onboard.engine.gates import evaluate, gate_passed, load_checklist, parse_checklist
from onboard.engine.ladder import RUNGS, RungSpec, ladder_states, next_step
from onboard.report.write import write_report
from onboard.rungs import kernels_rung as kernels
from onboard.rungs.gated_runs import settle_runs
from onboard.rungs.contract import RecipeEdit, RungContext
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.cli.views import show_outcome
from onboard.workspace.layout import Workspace
from titan_core.measure.timing import compare
from titan_core.kernels.fused_ce import FusedCrossEntropyHead
from titan_core.kernels import DEFAULTS
from onboard.rungs.kernel_compare import KERNEL_FLAGS, REFERENCE, parse_flag
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


def scripted_measure(monkeypatch, times: dict[str, tuple[float, float]]) -> None:
    """measure_kernel -> (step time with, without) per flag; default: slower, same memory (never kept)."""

    def measure(family=None, args=None, flag=None, against=None, **kw):
        w, wo = times.get(flag, (2.0, 1.0))
        field_name, _ = parse_flag(flag)
        return {"flag": flag, "reference": f"kernels.{field_name}={against or REFERENCE[field_name]}",
                "timing": timing(w, wo), "describe": f"scripted {w} vs {wo}",
                "with_kernel": {"step_time_s": w, "peak_memory_bytes": 1000},
                "with_reference": {"step_time_s": wo, "peak_memory_bytes": 1000}}  # fmt: skip

    monkeypatch.setattr("onboard.rungs.kernel_compare.measure_kernel", measure)


def assert_decisions_follow_the_rule(result) -> None:
    """Recompute every keep decision and every field's pick from the numbers the rung recorded."""
    rows, decisions = result.details["kernels"], result.details["decisions"]
    by_field: dict[str, dict] = {}
    for flag, r in rows.items():
        if r["status"] == "not_applicable":
            continue
        assert r["status"] == "compared", r
        d = kernels.keep_decision(
            passed=r["passed"],
            timing=r["timing"],
            peak_with=r["peak_memory_bytes"],
            peak_without=r["reference_peak_memory_bytes"],
        )
        assert d["kept"] == r["kept"] and d["outcome"] == r["outcome"] == r["timing"]["outcome"], flag
        assert d["kept"] == (r["timing"]["outcome"] == "faster" or r["reason"].startswith("saves")), flag
        field_name, choice = parse_flag(flag)
        by_field.setdefault(field_name, {})[choice] = r
    edits = {e.key: e.value for e in result.recipe_edits}
    for field_name, decision in decisions.items():
        kept = [c for c, r in by_field.get(field_name, {}).items() if r["kept"]]
        if field_name not in by_field:
            assert not decision["edit"]
            continue
        # the incumbent (else the simplest kept kernel) holds the field until a later one wins head to
        # head; none kept: the plain path, or the library default when it ran and was not slower
        was, rows_was = decision["was"], by_field.get(field_name, {}).get(decision["was"], {})
        default_stays = was == DEFAULTS[field_name] and "timing" in rows_was and rows_was.get("outcome") != "slower"
        expected = (was if was in kept else kept[0]) if kept else (was if default_stays else REFERENCE[field_name])
        for c in decision["contests"]:  # the challenger wins only on a `faster` that its interval supports
            assert c["holder"] == expected and c["won"] == (c["timing"]["outcome"] == "faster")
            check_comparison(c["timing"], kernels.protocol().min_effect)
            expected = c["challenger"] if c["won"] else expected
        assert decision["value"] == expected, (field_name, decision)
        assert decision["edit"] == (expected != decision["was"])
        assert edits.get(f"kernels.{field_name}") == (expected if decision["edit"] else None)


# ---- the keep rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "time_with, peak_with, peak_without, kept",
    [
        (1.0, 100, 100, False),  # exactly as fast: indistinguishable keeps the plain path
        (1.01, 100, 100, False),  # within the protocol's minimum effect: indistinguishable
        (0.9, 100, 100, True),  # faster beyond the minimum effect, and the interval says so
        (1.5, 80, 100, True),  # slower, exactly 20% less peak memory
        (1.5, 81, 100, False),  # slower, 19%
        (1.5, None, 100, False),  # an unmeasured peak cannot claim a saving
        (1.5, 0, 0, False),  # nothing to save from
        (0.5, None, None, True),  # faster: memory does not matter
    ],
)
def test_keep_decision_edges(time_with, peak_with, peak_without, kept):
    t = timing(time_with, 1.0)
    d = kernels.keep_decision(passed=True, timing=t, peak_with=peak_with, peak_without=peak_without)
    assert d["kept"] is kept and d["why"].startswith("kept" if kept else "not kept")
    assert "CI" in d["why"]  # the interval is always shown, never a bare ratio
    assert kernels.keep_decision(passed=False, timing=timing(0.1, 1.0), peak_with=1, peak_without=100)["kept"] is False


def test_keep_decision_on_noise_keeps_the_plain_path():
    import random

    rng = random.Random(0)
    noisy = compare(lambda: rng.lognormvariate(0, 0.2), lambda: rng.lognormvariate(0, 0.2), kernels.protocol())
    d = kernels.keep_decision(passed=True, timing=noisy.to_dict(), peak_with=100, peak_without=100)
    assert noisy.outcome == "indistinguishable" and d["kept"] is False


def test_choose_simplest_kept_unless_beaten_head_to_head_and_never_loop_under_capture():
    rows = {
        "sdpa": {"kept": True, "max_rel_err": 1e-7, "reason": "faster"},
        "tokamax": {"kept": True, "max_rel_err": 2e-7, "reason": "faster"},
        "flex": {"kept": False, "max_rel_err": 1.0, "reason": "wrong"},
    }
    calls = []

    def contest(outcome):
        def run(challenger, holder):
            calls.append((challenger, holder))
            return {"timing": {"outcome": outcome}, "describe": outcome}

        return run

    value, why, contests = kernels.choose("attention", rows, "sdpa", reference="naive", contest=contest("faster"))
    assert value == "tokamax" and calls == [("tokamax", "sdpa")] and contests[0]["won"] and "head to head" in why
    value, _, contests = kernels.choose(
        "attention", rows, "sdpa", reference="naive", contest=contest("indistinguishable")
    )
    assert value == "sdpa" and not contests[0]["won"]  # a tie keeps the simpler kernel
    calls.clear()  # the recipe's value is the incumbent: the others must beat it
    value, _, _ = kernels.choose("attention", rows, "tokamax", reference="naive", contest=contest("indistinguishable"))
    assert value == "tokamax" and calls == [("sdpa", "tokamax")]
    none = {"dense": {**rows["flex"]}}
    assert kernels.choose("moe", none, "dense", reference="loop")[0] == "loop"
    value, why, _ = kernels.choose("moe", none, "dense", reference="loop", captured=True)
    assert value == "dense" and "captured step cannot run loop" in why


def test_none_kept_keeps_the_library_default_unless_it_is_slower():
    """sdpa indistinguishable from naive: the recipe's sdpa stays (a re-run on noise never flips it);
    sdpa slower: the plain path; a recipe already on the plain path stays there."""
    row = {"kept": False, "ran": True, "max_rel_err": 1e-7, "reason": "not faster"}
    tie = {"sdpa": {**row, "outcome": "indistinguishable"}}
    value, why, _ = kernels.choose("attention", tie, "sdpa", reference="naive")
    assert value == "sdpa" and "library default" in why
    assert kernels.choose("attention", {"sdpa": {**row, "outcome": "slower"}}, "sdpa", reference="naive")[0] == "naive"
    assert kernels.choose("attention", {"sdpa": {**row, "ran": False}}, "sdpa", reference="naive")[0] == "naive"
    assert kernels.choose("attention", tie, "naive", reference="naive")[0] == "naive"
    tok = {"tokamax": {**row, "outcome": "indistinguishable"}}  # not the default: the plain path, the simpler
    assert kernels.choose("attention", tok, "tokamax", reference="naive")[0] == "naive"


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
    for f in compared:  # the recorded step times are the timing's medians; its outcome follows from its interval
        t = rows[f]["timing"]
        assert rows[f]["step_time_s"] == t["candidate_median_s"]
        assert rows[f]["reference_step_time_s"] == t["baseline_median_s"]
        check_comparison(t, kernels.protocol().min_effect)
    assert all(rows[f]["timing"]["rounds"] >= kernels.protocol().min_rounds for f in compared)
    assert_decisions_follow_the_rule(result)
    assert {p.name for p in result.files_read} == {"recipe.toml", "config.json", "adapter.py"}
    assert sum(line.startswith("kernels: kernels.") for line in lines) >= len(KERNEL_FLAGS)


@pytest.mark.slow
def test_a_broken_kernel_fails_the_gate_and_is_named(tmp_path, monkeypatch):
    right = SDPAttention.forward
    monkeypatch.setattr(SDPAttention, "forward", lambda self, *a, **k: right(self, *a, **k) * (1 + 1e-3))
    scripted_measure(monkeypatch, {"kernels.attention=sdpa": (0.1, 1.0)})  # fast, but wrong: never kept
    ws = narrowed_workspace(tmp_path, "llama3")
    result = run_rung(ws, tmp_path)
    m, row = result.measurements, result.details["kernels"]["kernels.attention=sdpa"]
    failed = {r["name"]: r for r in evaluate(load_checklist("kernels"), m) if not r["ok"]}
    assert {"logits", "grads"} <= set(failed) and "every_kernel_ran" not in failed
    assert m["worst_kernel"] == m["worst_logits_kernel"] == m["worst_grad_kernel"] == "kernels.attention=sdpa"
    assert m["worst_logits_rel_err"] > 1e-4 and m["worst_grad_param"]
    assert "worst_logits_kernel" in failed["logits"]["hint"] and "worst_grad_param" in failed["grads"]["hint"]
    assert row["passed"] is False and row["kept"] is False and "step_time_s" not in row
    assert result.details["decisions"]["attention"]["value"] != "sdpa"


@pytest.mark.slow
def test_a_kernel_that_raises_fails_every_kernel_ran(tmp_path, monkeypatch):
    def boom(self, *a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(FusedCrossEntropyHead, "forward", boom)
    scripted_measure(monkeypatch, {})
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
    # two models per comparison and two per timing (one more pair per head-to-head contest), every
    # one of them from the port's model.py
    # one more, on the meta device, to ask which swaps the port's modules can take, and one for the
    # recipe's whole run with the kernels kept
    contests = sum(len(d.get("contests", [])) for d in result.details["decisions"].values())
    assert len(counter.read_text()) == 1 + 4 * result.measurements["kernels_compared"] + 2 * contests + 1
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
            out.append(RungSpec(rung, "onboard.rungs.kernels_rung"))
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
    scripted_measure(monkeypatch, {"kernels.loss=fused_ce": (0.5, 1.0), "kernels.attention=sdpa": (0.5, 1.0)})
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


def test_an_edit_that_cannot_be_applied_fails_the_attempt(debug_ws):
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
    scripted_measure(monkeypatch, {"kernels.loss=fused_ce": (0.5, 1.0)})
    result = run_rung(ws, tmp_path)
    row = result.details["kernels"]["kernels.loss=fused_ce"]
    assert result.measurements["execution_mode"] == "compile" and row["passed"] is True
    assert row["kept"] is False and "execution mode" in row["reason"] and "graph-breaks" in row["reason"]
    assert row["mode_check"]["graph_breaks"] >= 1 and "step_time_s" not in row  # never timed
    assert result.details["decisions"]["loss"]["value"] == "plain"


@pytest.mark.slow
def test_grouped_mm_in_fp32_is_rejected_under_compile_with_the_reason(tmp_path, monkeypatch):
    """kernels.moe = grouped_mm equals the loop in fp32 eager, but torch.compile's grouped matmul
    takes bf16 only: in an fp32 recipe that compiles it does not apply, with that reason, is never
    timed, and the recipe does not get it."""
    ws = narrowed_workspace(tmp_path, "qwen3_moe")
    with open(ws.recipe_path, "a") as f:
        f.write("\n[compile]\nenable = true\n")
    scripted_measure(monkeypatch, {"kernels.moe=grouped_mm": (0.5, 1.0)})  # "faster": only the mode stops it
    result = run_rung(ws, tmp_path)
    row = result.details["kernels"]["kernels.moe=grouped_mm"]
    assert result.measurements["execution_mode"] == "compile"
    assert row["status"] == "not_applicable" and "bf16 only under torch.compile" in row["reason"], row
    assert "step_time_s" not in row and not row.get("kept")
    assert result.details["decisions"]["moe"]["value"] != "grouped_mm"
