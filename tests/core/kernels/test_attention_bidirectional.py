"""Cores asked for bidirectional attention (`causal=False`, FLUX's joint attention) against an
explicit full softmax, and the cores that cannot drop the causal mask refusing."""

import pytest
import torch
from kernel_helpers import FP32_TOL, attention_inputs, rel_l2

from titan_core.kernels.attention import FlexAttention, SplashAttention, TokamaxAttention
from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.models.common.mapping_errors import KernelRefusesModel


def _full_softmax(q, k, v, scale):
    return torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v


def _out_and_grads(fn, q, k, v):
    out = fn(q, k, v)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return out, torch.autograd.grad(out, (q, k, v), cot)


@pytest.mark.parametrize("core", [NaiveAttention, SDPAttention, TokamaxAttention], ids=lambda c: c.__name__)
def test_bidirectional_core_matches_a_full_softmax(core):
    q, k, v, _ = attention_inputs(seed=3)
    ref, ref_grads = _out_and_grads(lambda *t: _full_softmax(*t, 0.25), q, k, v)
    causal = NaiveAttention()(q, k, v, scale=0.25, window=None, segment_ids=None)
    assert rel_l2(causal, ref) > 0.1  # the causal mask really is dropped, not a vacuous match
    out, grads = _out_and_grads(lambda *t: core()(*t, scale=0.25, window=None, segment_ids=None, causal=False), q, k, v)
    assert rel_l2(out, ref) <= FP32_TOL
    for a, b in zip(grads, ref_grads):
        assert rel_l2(a, b) <= FP32_TOL


def test_flex_bidirectional_forward():
    q, k, v, _ = attention_inputs(seed=4)
    with torch.no_grad():
        out = FlexAttention()(q, k, v, scale=0.25, window=None, segment_ids=None, causal=False)
        assert rel_l2(out, _full_softmax(q, k, v, 0.25)) <= FP32_TOL


def test_splash_refuses_bidirectional_attention():
    q, k, v, _ = attention_inputs()
    with pytest.raises(KernelRefusesModel, match="bidirectional"):
        SplashAttention(interpret=True)(q, k, v, scale=0.25, window=None, segment_ids=None, causal=False)
