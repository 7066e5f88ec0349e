"""Parity comparisons and thresholds: exact round trip, relative errors, gradients, checklist."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from onboard.ladder.gates import load_checklist
from onboard.parity.compare import compare_grads, round_trip
from titan_core.measure.numerics import max_abs, rel_l2
from onboard.parity.criteria import RUNG_ONLY_METRICS, Criterion, asserted_criteria, load_criteria, threshold


def test_rel_l2_and_max_abs():
    e = torch.tensor([3.0, 4.0])
    assert rel_l2(e.clone(), e) == 0.0
    assert rel_l2(torch.tensor([3.0, 4.5]), e) == pytest.approx(0.1)
    assert max_abs(torch.tensor([3.0, 4.5]), e) == pytest.approx(0.5)
    assert rel_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert rel_l2(torch.ones(2), torch.zeros(2)) == math.inf


def test_round_trip_is_exact_and_names_what_differs():
    a = {"x": torch.tensor([1.0, 2.0]), "y": torch.ones(2, 3)}
    ok = round_trip(a, {k: v.clone() for k, v in a.items()})
    assert ok.same_keys and ok.max_abs_diff == 0.0 and ok.worst_key is None
    nudged = round_trip(a, {"x": torch.nextafter(a["x"], torch.tensor(9.0)), "y": a["y"]})
    assert 0 < nudged.max_abs_diff < 1e-6 and nudged.worst_key == "x"  # one ulp fails: exactness is the criterion
    assert round_trip(a, {"x": a["x"].double(), "y": a["y"]}).max_abs_diff == math.inf  # a dtype change too
    transposed = round_trip(a, {"x": a["x"], "y": a["y"].t()})
    assert transposed.max_abs_diff == math.inf and transposed.worst_key == "y"
    keys = round_trip(a, {"x": a["x"], "z": a["y"]})
    assert not keys.same_keys and keys.missing == ["y"] and keys.extra == ["z"]


def test_compare_grads_maps_names_and_treats_unused_params_as_zero():
    torch.manual_seed(0)
    native, upstream = nn.Linear(3, 2), nn.Linear(3, 2)
    upstream.load_state_dict(native.state_dict())
    x = torch.randn(4, 3)
    native(x).sum().backward()
    upstream(x).sum().backward()
    report = compare_grads(upstream, native, lambda sd: dict(sd))
    assert report.max_rel_l2 == 0.0 and not report.missing and not report.extra
    upstream.bias.grad = None  # an expert no token reached has no grad on either side
    native.bias.grad = None
    assert compare_grads(upstream, native, lambda sd: dict(sd)).max_rel_l2 == 0.0
    native.weight.grad *= 1.01
    report = compare_grads(upstream, native, lambda sd: dict(sd))
    assert report.worst_param == "weight" and report.max_rel_l2 == pytest.approx(0.01, rel=1e-3)
    renamed = compare_grads(upstream, native, lambda sd: {"w_" + k: v for k, v in sd.items()})
    assert renamed.max_rel_l2 == math.inf and renamed.missing == ["bias", "weight"]


def test_thresholds_are_design_section_5_and_shared_with_the_gate():
    assert threshold("logits_rel_l2") == 1e-5
    assert threshold("logits_max_abs") == 1e-4
    assert threshold("loss_abs_diff") == 1e-5
    assert threshold("grad_max_rel_l2") == 1e-4
    assert threshold("state_dict_max_abs_diff") == 0.0
    assert threshold("seq_len") == 512
    # the workspace test asserts what the gate evaluates, from the same file
    gate = {(c.name, c.metric, c.comparator, c.threshold) for c in load_checklist("parity").criteria}
    mine = {(c.name, c.metric, c.comparator, c.threshold) for c in load_criteria()}
    assert gate == mine
    assert {c.metric for c in asserted_criteria()} == {c.metric for c in load_criteria()} - RUNG_ONLY_METRICS


def test_criterion_fails_when_unmeasured_nan_or_not_true():
    le = Criterion("c", "v", "<=", 1e-5, "hint")
    assert le.check({"v": 1e-6}) == (True, 1e-6)
    assert le.check({"v": 2e-5})[0] is False
    assert le.check({}) == (False, None)
    assert le.check({"v": float("nan")})[0] is False
    assert le.check({"v": math.inf})[0] is False
    is_true = Criterion("t", "v", "is_true", None, "hint")
    assert is_true.check({"v": True})[0] and not is_true.check({"v": 1})[0]
    assert "needs <= 1e-05" in le.describe(2e-5) and "hint" in le.describe(2e-5)
