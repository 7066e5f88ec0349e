"""kernels.float8 in the kernels rung (onboard/rungs/kernels_rung/float8_check.py): a precision change judged
against the bf16 recipe by the bounds titan_core.kernels.float8 documents, never by the fp32
comparison. On a narrowed llama3 debugmodel workspace: a recipe within its bound is eligible (real
layers, real bf16 runs); one outside it (scripted loss curves, or a layer bound tightened) is not,
is never timed, and fails the gate's float8 criterion by name; where float8 cannot run, the row is
not_applicable with the reason. The keep rule's float8 decisions on scripted timings are in
test_kernels_keep_rule.py; the real rung, timing included, in tests/onboard/e2e/test_kernels_rung.py."""

from __future__ import annotations

import math

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from test_kernels_keep_rule import NO_LEDGER, Script, narrowed, peaks

from onboard.ladder.contract import RungContext
from onboard.ladder.decision import NOT_ELIGIBLE
from onboard.ladder.gates import evaluate, load_checklist
from onboard.rungs.kernels_rung import compare as kernel_compare
from onboard.rungs.kernels_rung import float8_check as kernels_float8
from onboard.rungs.kernels_rung import rung as kernels_rung
from onboard.rungs.kernels_rung.compare import REFERENCE, applicable_kernels
from onboard.rungs.kernels_rung.decide import MemoryRule, decide_all, field_inputs, mark_rows
from titan_core.kernels.float8 import E4M3_UNIT_ROUNDOFF, FLOAT8_GRAD_REL_L2, FLOAT8_LOSS_REL, FLOAT8_OUTPUT_REL_L2
from titan_core.models import build_meta, resolve_args
from titan_core.models.common.init_stand_in import ShardedInitError

FLOOR = E4M3_UNIT_ROUNDOFF / 4
"""Below this a layer was not rounded to float8 at all (bf16 alone is off by ~0.003)."""
FLAGS = ("kernels.float8=tensorwise", "kernels.float8=rowwise")


@pytest.fixture
def setting(tmp_path):
    """(ctx, Float8Check, log lines) on the narrowed llama3 workspace (2 layers of width 64, fp32 recipe)."""
    ws = narrowed(tmp_path)
    (tmp_path / "attempt").mkdir()
    lines: list[str] = []
    ctx = RungContext(workspace=ws, attempt_dir=tmp_path / "attempt", evidence={}, log=lines.append)
    bench = kernels_rung.Bench.of(ctx)
    _, mode_kw = bench.kwargs()
    check = kernels_float8.Float8Check(ctx, bench.cfg, device=bench.device, builder=bench.builder, mode_kw=mode_kw)
    return ctx, check, lines


def float8_gate(rows: dict, precision: str = "fp32") -> dict[str, dict]:
    """The kernels checklist's float8 criteria judged on the rung's totals of `rows`."""
    results = evaluate(load_checklist("kernels"), {**kernels_rung.totals(rows), "precision": precision})
    return {r["name"]: r for r in results if r["name"].startswith("float8")}


def test_a_float8_recipe_within_its_bound_of_the_bf16_recipe_is_eligible(setting):
    ctx, check, lines = setting
    rows = {flag: check.row(flag) for flag in FLAGS}
    blocks = {f"layers.{i}.{m}" for i in range(2) for m in ("attention.wq", "attention.wk", "attention.wv",
              "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")}  # fmt: skip
    for flag, row in rows.items():
        recipe = flag.split("=")[1]
        assert (row["status"], row["passed"], row["eligible"]) == ("compared", True, True), row
        assert set(row["converted"]) == blocks and list(row["unconverted"]) == ["output"]
        assert row["unconverted"]["output"].startswith("output head")
        # the bounds are titan_core's own, and each layer was really rounded to float8
        assert (row["layer_output_bound"], row["layer_grad_bound"], row["loss_bound"]) == (
            FLOAT8_OUTPUT_REL_L2[recipe], FLOAT8_GRAD_REL_L2[recipe], FLOAT8_LOSS_REL)
        assert FLOOR < row["layer_output_rel"] <= row["layer_output_bound"]
        assert FLOOR < row["layer_grad_rel"] <= row["layer_grad_bound"]
        assert row["layer_output_worst"] in blocks and row["layer_grad_worst"] in blocks
        # both runs learn, in bf16, and stay within the loss bound at every step; they are not the same run
        curve, ref = row["loss_curve"], row["loss_curve_reference"]
        assert len(curve) == len(ref) == 10 and curve != ref and curve[-1] < curve[0]
        assert 0 < row["loss_rel"] <= FLOAT8_LOSS_REL and 1 <= row["loss_rel_step"] <= 10
        assert row["precision"] == "bf16" and "fp32" in row["dtype_why"]
        assert "training.dtype = bfloat16" in row["dtype_why"]
        assert row["emulated"] and "emulation" in row["matmuls"] and row["mode_check"]["ok"]
        assert row["matches"].startswith("within float8's bound of the bf16 recipe")
    # one bf16 reference run serves both recipes: three runs in all, each recorded as the gate's
    assert [r["run"].split(", ")[1] for r in ctx.runs] == [
        "kernels.float8=tensorwise (bf16)", "kernels.float8=none (bf16)", "kernels.float8=rowwise (bf16)"]
    assert all(r["problem"] is None for r in ctx.runs)
    assert sum("vs the bf16 recipe" in line for line in lines) == 2
    gate = float8_gate(rows)  # no keep rule yet: the recipe holds no float8, so trains none
    assert all(r["ok"] and r["value"] == 0.0 for r in gate.values()), gate
    rows["kernels.float8=rowwise"]["kept"] = True  # the recipe holds rowwise: its own numbers are judged
    gate = float8_gate(rows)
    assert all(r["ok"] for r in gate.values()), gate
    assert gate["float8_loss"]["value"] == rows["kernels.float8=rowwise"]["loss_rel"] > 0
    assert gate["float8_loss"]["threshold"] == FLOAT8_LOSS_REL and "bf16" in gate["float8_loss"]["bound_why"]
    m = kernels_rung.per_flag(rows)
    assert m["float8_rowwise_layers_converted"] == 14 and m["float8_rowwise_layers_unconverted"] == 1
    assert m["float8_tensorwise_loss_rel"] == rows[FLAGS[0]]["loss_rel"]


def test_a_float8_recipe_outside_its_loss_bound_is_not_eligible_never_timed_and_stays_out(setting, monkeypatch):
    _, check, _ = setting
    bf16 = [5.5 - 0.1 * i for i in range(10)]
    curves = {"none": bf16, "tensorwise": [x * (1 + 2.5 * FLOAT8_LOSS_REL) for x in bf16], "rowwise": list(bf16)}
    monkeypatch.setattr(check, "losses", curves.__getitem__)
    rows = {flag: check.row(flag) for flag in FLAGS}
    row = rows["kernels.float8=tensorwise"]
    assert (row["passed"], row["eligible"]) == (False, False) and "mode_check" not in row
    assert row["loss_rel"] == pytest.approx(2.5 * FLOAT8_LOSS_REL)
    assert row["failed_why"].startswith("leaves float8's documented bound of the bf16 recipe (loss:")
    assert rows["kernels.float8=rowwise"]["eligible"]  # the other recipe stands on its own numbers
    # the keep rule: the recipe outside its bound is never timed, the one within is
    timer = Script({("float8", "rowwise", "none"): (1.5, 1.0)})
    inputs = field_inputs(rows, check.cfg.kernels, REFERENCE, ledger=NO_LEDGER, plain_runs=lambda f: None)
    edits, choices = decide_all(inputs, time=timer, peak=peaks(), rule=MemoryRule.of_checklist())
    mark_rows(rows, choices)
    assert [c for c in timer.calls if c[0] == "float8"] == [("float8", "rowwise", "none")]
    d = next(d for d in choices["float8"].decisions if d.candidate == "tensorwise")
    assert d.verdict == NOT_ELIGIBLE and "leaves float8's documented bound" in d.why and "fp32" not in d.why
    assert choices["float8"].value == "none" and not [e for e in edits if e.key == "kernels.float8"]
    assert "timing" not in row and row["kept"] is False
    # the recipe holds no float8, so the gate stands: a precision the recipe does not take is no wrong kernel
    gate = float8_gate(rows, precision="fp32")
    assert gate["float8_loss"]["ok"] and gate["float8_loss"]["value"] == 0.0
    # were the recipe to hold it (a keep rule gone wrong), the gate names the criterion and its bound's precision
    row["kept"] = True
    gate = float8_gate(rows, precision="fp32")
    assert not gate["float8_loss"]["ok"] and gate["float8_loss"]["value"] == pytest.approx(2.5 * FLOAT8_LOSS_REL)
    assert gate["float8_loss"]["precision"] == "fp32" and "never fp32" in gate["float8_loss"]["bound_why"]
    assert gate["float8_layers"]["ok"]
    assert kernels_rung.totals(rows)["worst_float8_loss_kernel"] == "kernels.float8=tensorwise"


def test_a_layer_outside_its_bound_makes_the_recipe_not_eligible(setting, monkeypatch):
    _, check, _ = setting
    curves = {v: [5.0, 4.5] for v in ("none", "tensorwise")}
    monkeypatch.setattr(check, "losses", curves.__getitem__)
    # a bound tighter than float8's e5m2 gradient rounding: read from titan_core, so the row sees it
    monkeypatch.setitem(FLOAT8_GRAD_REL_L2, "tensorwise", FLOOR)
    row = check.row("kernels.float8=tensorwise")
    assert not row["eligible"] and row["layer_grad_rel"] > FLOOR and row["loss_rel"] == 0.0
    assert "(layer gradients:" in row["failed_why"]
    gate = float8_gate({"kernels.float8=tensorwise": {**row, "kept": True}})  # as if the recipe held it
    assert not gate["float8_layers"]["ok"] and gate["float8_layers"]["value"] > 1 and gate["float8_loss"]["ok"]


def test_where_float8_cannot_run_it_does_not_apply_and_says_why(setting, monkeypatch):
    args = resolve_args("llama3", "debugmodel", {"n_layers": 1})
    on_tpu = applicable_kernels(args, device="tpu")  # a string: no torch_tpu needed to ask
    assert all("not available on tpu" in on_tpu[f] for f in FLAGS)
    assert all(applicable_kernels(args)[f] is None for f in FLAGS)  # CPU: torchao's emulation
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "A100")
    on_a100 = applicable_kernels(args, device="cuda")
    assert all("compute capability 8.9 or newer" in on_a100[f] and "A100 is 8.0" in on_a100[f] for f in FLAGS)
    monkeypatch.setattr(kernel_compare, "_has_torchao", lambda: False)
    without = applicable_kernels(args, model=build_meta("llama3", args))  # a port's model is not asked then
    assert all("pip install 'titan-onboard[float8]'" in without[f] for f in FLAGS)
    # a model with no linear float8 can take (every dim off the multiple of 16): not applicable, with the reason
    _, check, lines = setting
    small = resolve_args("llama3", "debugmodel", dict(n_layers=1, dim=24, n_heads=2, n_kv_heads=2, ffn_hidden_dim=40,
                                                      vocab_size=64))  # fmt: skip
    check.builder = lambda: build_meta("llama3", small)
    row = check.row("kernels.float8=rowwise")
    assert row["status"] == "not_applicable" and "every candidate is skipped" in row["reason"]
    assert "not multiples of 16" in row["reason"] and any("not applicable" in line for line in lines)
    totals = kernels_rung.totals({f: {"status": "not_applicable", "reason": "."} for f in FLAGS})
    none = (totals["float8_checked"], totals["worst_float8_loss_rel"], totals["worst_float8_loss_kernel"])
    assert none == (0, 0.0, None)
    raised = {"status": "raised", "error": "x"}
    assert kernels_rung.totals({FLAGS[0]: raised})["worst_float8_loss_rel"] == 0.0  # not held: not judged
    assert math.isinf(kernels_rung.totals({FLAGS[0]: {**raised, "kept": True}})["worst_float8_loss_rel"])


def test_a_model_titan_core_builds_only_in_its_init_dtype_is_not_applicable(setting, monkeypatch):
    """Mamba's init returns to conv1d.weight after other parameters, so titan_core refuses to build it in bf16
    (ShardedInitError, the compat sweep's mamba row): float8, judged against the bf16 recipe, cannot be
    compared there. That is the model's property, not a kernel that raised: not_applicable, with the refusal."""
    _, check, lines = setting
    refusal = ShardedInitError("init_weights returns to backbone.layers.0.mixer.conv1d.weight after it went on")

    def refuse(*a, **k):
        raise refusal

    monkeypatch.setattr(kernels_float8, "build_model_with", refuse)
    row = check.row("kernels.float8=tensorwise")
    assert row["status"] == "not_applicable" and "does not build this model in bf16" in row["reason"]
    assert "conv1d.weight" in row["reason"] and any("not applicable" in line for line in lines)
    # any other error of the build is still the kernel's failure
    monkeypatch.setattr(kernels_float8, "build_model_with", lambda *a, **k: 1 / 0)
    assert check.row("kernels.float8=tensorwise")["status"] == "raised"
