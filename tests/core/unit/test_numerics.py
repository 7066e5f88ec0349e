"""titan_core.measure.numerics: the one relative-error rule, and both gates (parity, kernels) applying it.

The case the two gates once disagreed on: a gradient that is exactly zero in the reference
(here the router of a MoE layer whose reference experts see detached routing weights, as a
layer no token reaches would) against a small non-zero gradient on the other side.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from onboard.parity.compare import compare_grads
from onboard.rungs.kernel_compare import compare_kernel
from titan_core.models.common import moe as moe_module
from titan_core.models.registry import resolve_args
from titan_core.measure.numerics import curve_max_rel, max_abs, rel, rel_l2

ROUTER = "layers.0.moe.router.gate.weight"


def test_zero_reference_rule():
    z = torch.zeros(3)
    assert rel_l2(z, z) == 0.0 and rel_l2(z + 1e-30, z) == math.inf
    assert rel_l2(None, None) == 0.0 and rel_l2(None, z) == 0.0 and rel_l2(z, None) == 0.0
    assert rel_l2(torch.ones(3), None) == math.inf and rel_l2(None, torch.ones(3)) == 1.0
    assert rel(0.0, 0.0) == 0.0 and rel(1e-30, 0.0) == math.inf and rel(2.0, 4.0) == 0.5
    assert rel_l2(torch.tensor([math.nan]), torch.ones(1)) == math.inf and rel(math.nan, 1.0) == math.inf


def test_float64_accumulation_and_max_abs():
    e = torch.tensor([3.0, 4.0])
    assert rel_l2(torch.tensor([3.0, 4.5]), e) == pytest.approx(0.1)
    assert max_abs(torch.tensor([3.0, 4.5]), e) == pytest.approx(0.5) and max_abs(torch.ones(0), torch.ones(0)) == 0.0
    big = torch.full((10,), 1e30, dtype=torch.float32)
    assert rel_l2(big * (1 + 2**-20), big) == pytest.approx(2**-20, rel=0.05)  # squares of 1e30 overflow float32
    with pytest.raises(ValueError, match="shapes differ"):
        rel_l2(torch.ones(2), torch.ones(3))


def test_curves():
    assert curve_max_rel([1.0, 2.2], [1.0, 2.0]) == (pytest.approx(0.1), 2)
    assert curve_max_rel([1.0], [1.0, 2.0]) == (math.inf, None) and curve_max_rel([], []) == (math.inf, None)
    assert curve_max_rel([1.0, math.nan], [1.0, 2.0]) == (math.inf, 2)


def test_parity_gate_applies_the_zero_reference_rule():
    native, upstream = nn.Linear(3, 2), nn.Linear(3, 2)
    upstream.load_state_dict(native.state_dict())
    for m in (native, upstream):
        m.weight.grad = torch.ones(2, 3)
        m.bias.grad = torch.zeros(2)
    assert compare_grads(upstream, native, dict).per_param["bias"] == 0.0
    native.bias.grad = torch.full((2,), 1e-9)  # non-zero where the reference is exactly zero
    assert compare_grads(upstream, native, dict).per_param["bias"] == math.inf == rel_l2(native.bias.grad, torch.zeros(2))


def test_kernels_gate_applies_the_same_rule(monkeypatch):
    args = dataclasses.replace(resolve_args("qwen3_moe", "debugmodel", {"n_layers": 1}), aux_loss_coef=0.0)
    loop = moe_module.Experts.forward
    # the reference experts see detached routing weights: the router's reference gradient is exactly zero
    monkeypatch.setattr(moe_module.Experts, "forward", lambda self, x, w, e: loop(self, x, w.detach(), e))
    cmp = compare_kernel("qwen3_moe", args, "kernels.moe=dense", batch=1, seq_len=8)
    assert cmp.loss_rel_err <= 1e-6 and cmp.logits_rel_err <= 1e-6  # the forward is the same
    assert cmp.grad_rel_err[ROUTER] == math.inf and cmp.worst_param == ROUTER
