"""Both gates (parity, kernels) apply titan_core.measure.numerics' one relative-error rule.

The case the two gates once disagreed on: a gradient that is exactly zero in the reference
(here the router of a MoE layer whose reference experts see detached routing weights, as a
layer no token reaches would) against a small non-zero gradient on the other side. The rule
itself: tests/core/unit/test_numerics.py.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from onboard.parity.compare import compare_grads
from onboard.rungs.kernels_rung.compare import compare_kernel
from titan_core.measure.numerics import rel_l2
from titan_core.models.common import moe as moe_module
from titan_core.models.registry import resolve_args

ROUTER = "layers.0.moe.router.gate.weight"


def test_parity_gate_applies_the_zero_reference_rule():
    native, upstream = nn.Linear(3, 2), nn.Linear(3, 2)
    upstream.load_state_dict(native.state_dict())
    for m in (native, upstream):
        m.weight.grad = torch.ones(2, 3)
        m.bias.grad = torch.zeros(2)
    assert compare_grads(upstream, native, dict).per_param["bias"] == 0.0
    native.bias.grad = torch.full((2,), 1e-9)  # non-zero where the reference is exactly zero
    assert (
        compare_grads(upstream, native, dict).per_param["bias"] == math.inf == rel_l2(native.bias.grad, torch.zeros(2))
    )


def test_a_gradient_at_fp32_rounding_of_an_exact_zero_agrees_and_one_above_it_does_not():
    # a key bias softmax cancels: zero in exact arithmetic, each model's own rounding in practice
    native, upstream = nn.Linear(3, 2), nn.Linear(3, 2)
    for m, noise in ((native, 3e-12), (upstream, -2e-12)):
        m.weight.grad = torch.ones(2, 3)
        m.bias.grad = torch.full((2,), noise)
    assert rel_l2(native.bias.grad, upstream.bias.grad) > 1  # relative to itself, noise disagrees
    assert compare_grads(upstream, native, dict, tokens=128).per_param["bias"] == 0.0
    # a real difference stays one: the rounding level of 128 tokens is ~3e-6 of this gradient's norm
    native.bias.grad = torch.full((2,), 1e-5)
    assert compare_grads(upstream, native, dict, tokens=128).per_param["bias"] > 1


def test_kernels_gate_applies_the_same_rule(monkeypatch):
    args = dataclasses.replace(resolve_args("qwen3_moe", "debugmodel", {"n_layers": 1}), aux_loss_coef=0.0)
    loop = moe_module.Experts.forward
    # the reference experts see detached routing weights: the router's reference gradient is exactly zero
    monkeypatch.setattr(moe_module.Experts, "forward", lambda self, x, w, e: loop(self, x, w.detach(), e))
    cmp = compare_kernel("qwen3_moe", args, "kernels.moe=dense", batch=1, seq_len=8)
    assert cmp.loss_rel_err <= 1e-6 and cmp.logits_rel_err <= 1e-6  # the forward is the same
    assert cmp.grad_rel_err[ROUTER] == math.inf and cmp.worst_param == ROUTER


def test_kernels_gate_agrees_on_a_key_bias_gradient_at_rounding_level():
    # BART's key projection has a bias that softmax cancels: its gradient is zero in exact
    # arithmetic, and each attention kernel's rounding of it differs by more than 100% of itself
    import pytest

    transformers = pytest.importorskip("transformers")
    from titan_core.models.transformers import ADAPTER

    config = transformers.BartConfig(d_model=64, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     vocab_size=256, max_position_embeddings=256, dropout=0.0, attention_dropout=0.0,
                                     activation_dropout=0.0)  # fmt: skip
    args, _ = ADAPTER.args_from_hf(config.to_dict())
    for flag in ("kernels.attention=sdpa", "kernels.loss=fused_ce"):
        cmp = compare_kernel("transformers", args, flag, batch=2, seq_len=64)
        biases = [n for n in cmp.grad_rel_err if n.endswith("self_attn.k_proj.bias")]
        assert len(biases) == 2 and all(cmp.grad_rel_err[n] == 0.0 for n in biases), flag
        assert cmp.max_grad_rel_err <= 1e-5, (flag, cmp.worst_param)
