"""Each criterion says what it checked (a comparison with nothing to compare is not applicable, never
a passing 0.0; init parity names that it compares statistics), no waiver passes a run that broke,
and an interval that measured nothing prints as "not measured" wherever an interval is printed."""

from __future__ import annotations

import math

import pytest

from onboard.cli.views import headline_of
from onboard.ladder.gates import (
    ChecklistError, evaluate, fmt_interval, interval_measured, load_checklist, measured_decision, parse_checklist,
)  # fmt: skip
from onboard.report.speed_section import factor_cell
from onboard.report.steps import Factor, decision_factor
from onboard.workspace.ledger import Entry

NO_CHECKPOINT = "none: the recipe has no checkpoint.initial_hf (a fresh init, judged by step1_loss_near_expected)"


def criterion(checklist: str, name: str, measurements: dict, waivers: dict | None = None) -> dict:
    return next(c for c in evaluate(load_checklist(checklist), measurements, {}, waivers) if c["name"] == name)


def test_the_transformers_comparison_without_a_checkpoint_is_not_applicable_not_a_passing_number():
    c = criterion("eager", "step1_loss_vs_transformers",
                  {"step1_loss_reference": NO_CHECKPOINT, "step1_loss_vs_transformers_rel_err": 0.0})  # fmt: skip
    assert c["ok"] and c["value"] is None and c["threshold"] is None
    assert "no checkpoint.initial_hf: there is no reference checkpoint" in c["not_applicable"]
    # with a checkpoint it is a comparison again, judged by its number
    ref = "transformers' loss of checkpoint.initial_hf (/w) on the same batch"
    c = criterion("eager", "step1_loss_vs_transformers",
                  {"step1_loss_reference": ref, "step1_loss_vs_transformers_rel_err": 0.5})  # fmt: skip
    assert not c["ok"] and c["value"] == 0.5 and c["not_applicable"] is None
    assert "transformers' loss of the same checkpoint" in c["checks"]


def test_init_parity_says_it_compares_statistics_and_constants_not_values():
    c = criterion("parity", "init_matches_upstream", {"init_tensors_differing": 0})
    assert c["ok"]
    for said in ("not values", "same spread, other values", "mean and std", "exactly that value"):
        assert said in c["checks"], said
    assert "per-tensor mean and std" in c["hint"]


@pytest.mark.parametrize("rung, name", [
    ("eager", "all_finite"), ("eager", "every_run_whole"), ("tuning", "final_recipe_ran_whole"),
    ("compile", "every_run_whole"),
])  # fmt: skip
def test_a_waiver_of_finiteness_is_ignored_and_said(rung, name):
    metric = load_checklist(rung).criterion(name).metric
    waiver = {name: {"why": "a toy", "time": "2026-01-01T00:00:00+00:00"}}
    c = criterion(rung, name, {metric: False}, waiver)
    assert (c["ok"], c["waived"]) == (False, False)
    assert "the waiver on record (a toy) is ignored" in c["waiver_ignored"]
    assert "cannot be waived" in c["waiver_ignored"]
    other = criterion("eager", "loss_falls", {"last_loss": 8.0, "step1_loss": 7.0}, {"loss_falls": waiver[name]})
    assert (other["ok"], other["waived"], other["waiver_ignored"]) == (True, True, None)  # others still waive


def test_a_checklist_cannot_make_finiteness_waivable_and_says_malformed_keys():
    data = {"rung": "r", "criteria": [{"name": "whole", "metric": "runs_whole", "comparator": "is_true", "hint": "h",
                                       "waivable": True}]}  # fmt: skip
    assert not parse_checklist(data, "test").criteria[0].waivable
    data["criteria"][0]["waivable"] = "no"
    with pytest.raises(ChecklistError, match="waivable must be true or false"):
        parse_checklist(data, "test")
    data["criteria"][0] |= {"waivable": True, "not_applicable_when": {"metric": "m"}}
    with pytest.raises(ChecklistError, match="not_applicable_when must be"):
        parse_checklist(data, "test")


@pytest.mark.parametrize("low, high, shown", [
    (1.21, 1.38, "1.21-1.38"),
    (0.0, 512246.96, "not measured"),  # the bf16 timing status once printed
    (0.004, 1.2, "not measured"),  # 300x apart: says nothing
    (math.nan, 1.2, "not measured"), (1.0, math.inf, "not measured"), (1.3, 1.2, "not measured"),
    (None, 1.2, "not measured"), ("1.1", "1.2", "not measured"),
])  # fmt: skip
def test_an_interval_prints_only_when_it_measured_something(low, high, shown):
    assert fmt_interval(low, high) == shown
    assert interval_measured(low, high) is (shown != "not measured")


def decision(ci):
    return {"rung": "compile", "lever": "execution_mode", "holder": "eager", "candidate": "compile", "value": "eager",
            "verdict": "indistinguishable", "figure": "speed", "speedup": 1.02, "ci": ci, "confidence": 0.99,
            "outcome": "indistinguishable", "why": "w"}  # fmt: skip


def test_status_and_the_report_print_a_degenerate_decision_interval_as_not_measured():
    entry = Entry(rung="compile", attempt=1, status="passed", details={"decisions": [decision([0.0, 512246.96])]})
    assert headline_of(entry) == "execution_mode compile: not measured indistinguishable"
    good = Entry(rung="compile", attempt=1, status="passed", details={"decisions": [decision([0.95, 1.09])]})
    assert headline_of(good) == "execution_mode compile: 1.02x (0.95-1.09) indistinguishable"
    assert decision_factor(measured_decision(decision([1e-6, 5.0]))) is None  # no speed-up on a wide interval
    assert decision_factor(decision([1e-6, 5.0])).low is None  # the report's own reader drops it too
    wide = Factor(1.5, 0.01, 40.0, 0.01, "indistinguishable", True, "", 2)  # a product of intervals, 4000x apart
    assert factor_cell(wide) == "1.50x (interval: not measured)"  # and no outcome the interval cannot carry
    assert factor_cell(Factor(1.5, 1.2, 1.8, 0.01, "faster")) == "1.50x (1.20-1.80, 99%) faster"
