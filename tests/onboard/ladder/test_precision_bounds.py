"""A bound belongs to a precision, and a gated run counts only when it ran whole.

The checklists' per-precision thresholds (onboard/ladder/gates.py), the recipe's precision
(gate_recipe.precision), the runs each rung records (onboard/ladder/contract.py) and the shipped
checklists that use them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from onboard.ladder.gates import PRECISIONS, ChecklistError, evaluate, gate_passed, load_checklist, parse_checklist
from onboard.rungs import gate_recipe
from onboard.ladder.contract import GatedRuns, RungContext, record_run, settle_runs
from titan_core.measure.run_stats import not_whole

PER_PRECISION = {
    "rung": "compile",
    "criteria": [{
        "name": "step1_loss", "metric": "err", "comparator": "<=", "hint": "h",
        "threshold": {"fp32": 1e-5, "bf16": "evidence.eager.bf16_rounding_bound"},
        "bound_why": {"fp32": "fp32 rounding", "bf16": "twice the recipe's own bf16 rounding"},
    }],
}  # fmt: skip


def test_a_per_precision_bound_is_the_one_of_the_runs_precision_and_says_why():
    checklist = parse_checklist(PER_PRECISION, "t.yaml")
    evidence = {"eager": {"bf16_rounding_bound": 5e-4}}
    # 2.26e-5: what per-block compile of a bf16 recipe measured; fp32's bound fails it, bf16's does not
    bf16 = evaluate(checklist, {"err": 2.26e-5, "precision": "bf16"}, evidence)[0]
    assert bf16["ok"] and bf16["threshold"] == 5e-4 and bf16["precision"] == "bf16"
    assert bf16["threshold_ref"] == "evidence.eager.bf16_rounding_bound"
    assert bf16["bound_why"] == "twice the recipe's own bf16 rounding"
    fp32 = evaluate(checklist, {"err": 2.26e-5, "precision": "fp32"}, evidence)[0]
    assert not fp32["ok"] and fp32["threshold"] == 1e-5 and fp32["bound_why"] == "fp32 rounding"


def test_a_per_precision_bound_fails_an_attempt_that_did_not_say_its_precision_or_lacks_the_evidence():
    checklist = parse_checklist(PER_PRECISION, "t.yaml")
    unsaid = evaluate(checklist, {"err": 0.0}, {"eager": {"bf16_rounding_bound": 1.0}})[0]
    assert not unsaid["ok"] and "precision" in unsaid["hint"]
    no_bound = evaluate(checklist, {"err": 0.0, "precision": "bf16"}, {"eager": {}})[0]
    assert not no_bound["ok"] and "bf16_rounding_bound" in no_bound["hint"]


@pytest.mark.parametrize(
    "change",
    [
        {"threshold": {"fp32": 1e-5}},  # a precision without its bound
        {"threshold": {"fp32": 1e-5, "bf16": 1e-3, "fp16": 1e-3}},  # one the recipe cannot hold
        {"threshold": {"fp32": 1e-5, "bf16": True}},  # not a number or reference
        {"bound_why": {"fp32": "only one reason"}},  # a bound without its reason
    ],
)
def test_a_per_precision_bound_names_every_precision_with_its_reason(change):
    data = {**PER_PRECISION, "criteria": [{**PER_PRECISION["criteria"][0], **change}]}
    with pytest.raises(ChecklistError):
        parse_checklist(data, "t.yaml")


def _training(dtype="float32", param="float32", reduce="float32"):
    return SimpleNamespace(dtype=dtype, mixed_precision_param=param, mixed_precision_reduce=reduce)


def test_the_recipes_precision_is_bf16_when_any_of_its_dtypes_is():
    assert gate_recipe.precision(_training()) == "fp32"
    assert gate_recipe.precision(_training(param="bfloat16")) == "bf16"
    assert gate_recipe.precision(_training(dtype="bfloat16", param="bfloat16")) == "bf16"
    assert gate_recipe.precision(_training(reduce="bfloat16")) == "bf16"


@pytest.mark.parametrize(
    ("rung", "criterion", "fp32"),
    [("compile", "step1_loss", 1e-5), ("tuning", "final_step1_loss", 1e-5), ("tuning", "final_step1_grad_norm", 1e-5),
     ("graph_trainer", "exact_to_eager", 0.0)],
)
def test_every_shipped_comparison_of_two_runs_of_the_recipe_has_a_bound_per_precision(rung, criterion, fp32):
    c = load_checklist(rung).criterion(criterion)
    assert c.per_precision and set(c.threshold) == set(PRECISIONS)
    assert c.threshold["fp32"] == fp32 and c.threshold["bf16"] == "evidence.eager.bf16_rounding_bound"
    assert all(len(c.bound_why[p]) > 40 for p in PRECISIONS)


def test_tuning_keeps_a_change_within_the_bound_its_final_recipe_is_judged_by():
    evidence = {"eager": {"bf16_rounding_bound": 4e-4}}
    assert gate_recipe.bound("tuning", "final_step1_loss", "fp32", evidence) == 1e-5
    assert gate_recipe.bound("tuning", "final_step1_loss", "bf16", evidence) == 4e-4
    with pytest.raises(RuntimeError, match="bf16_rounding_bound"):
        gate_recipe.bound("tuning", "final_step1_loss", "bf16", {})
    assert gate_recipe.param("tuning", "curve_rel", "fp32") == 1e-3
    assert gate_recipe.param("tuning", "curve_rel", "bf16") == 2e-2


def _rows(*values):
    return [{"step": i, "loss": loss, "grad_norm": norm} for i, (loss, norm) in enumerate(values, start=1)]


def test_a_run_is_whole_only_with_every_planned_step_finite_and_says_which_step_and_quantity():
    assert not_whole(_rows((2.0, 1.0), (1.9, 0.9)), 2) is None
    short = not_whole(_rows((2.0, 1.0), (1.9, 0.9)), 20)
    assert short == "the run stopped after step 2 of 20 planned, every logged value finite"
    nan_norm = not_whole(_rows((2.0, 1.0), (1.9, math.nan)), 20)
    assert nan_norm.startswith("the grad norm at step 2 is nan") and "2 of 20" in nan_norm
    inf_loss = not_whole(_rows((2.0, 1.0), (math.inf, 0.9)), 2)
    assert inf_loss.startswith("the loss at step 2 is inf")


def test_a_gate_fails_when_any_run_it_recorded_was_not_whole(tmp_path):
    ctx = RungContext(workspace=None, attempt_dir=tmp_path, evidence={}, log=lambda line: None)
    assert record_run(ctx, "compile", _rows((2.0, 1.0)), 1) is None
    assert "step 2" in record_run(ctx, "compile: timed", _rows((2.0, 1.0), (1.9, math.nan)), 20)
    m = GatedRuns(precision="fp32")
    settle_runs(m, ctx.runs)
    assert m.runs_recorded == 2 and m.runs_whole is False
    assert m.runs_not_whole == ["compile: timed: the grad norm at step 2 is nan (2 of 20 planned steps logged)"]
    for rung in ("eager", "simple_fsdp", "compile", "graph_trainer", "kernels", "tuning"):
        criteria = {c["name"]: c for c in evaluate(load_checklist(rung), m)}
        assert not criteria["every_run_whole"]["ok"], rung
    whole = GatedRuns(precision="fp32")
    settle_runs(whole, ctx.runs[:1])
    assert gate_passed([c for c in evaluate(load_checklist("compile"), whole) if c["name"] == "every_run_whole"])


def test_a_rung_that_recorded_no_run_does_not_pass_by_being_unmeasured():
    m = GatedRuns(precision="fp32")
    settle_runs(m, [])
    criterion = next(c for c in evaluate(load_checklist("compile"), m) if c["name"] == "every_run_whole")
    assert not criterion["ok"] and "did not measure" in criterion["hint"]
