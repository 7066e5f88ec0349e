"""Attention cores vs the naive reference, for every mask kind, at a sequence length (37)
that is not a multiple of any block size; plus the errors where a backend cannot run."""

import pytest
import torch
from kernel_helpers import BF16_TOL, FP32_TOL, MASKS, attention_inputs, out_and_grads, rel_l2

from titan_core.kernels.attention import FlexAttention, KernelUnavailable, SplashAttention, TokamaxAttention
from titan_core.models.common.attention import NaiveAttention, SDPAttention


def _check_against_naive(core, mask, *, dtype=torch.float32, tol=FP32_TOL, grads=True, **shape):
    window, packed, kv_heads = MASKS[mask]
    q, k, v, seg = attention_inputs(kv_heads=kv_heads, packed=packed, dtype=dtype, **shape)
    ref_out, ref_grads = out_and_grads(NaiveAttention(), q, k, v, seg, window)
    if not grads:
        with torch.no_grad():
            out = core(q, k, v, scale=0.25, window=window, segment_ids=seg)
        assert rel_l2(out, ref_out) <= tol, (mask, rel_l2(out, ref_out))
        return
    out, got_grads = out_and_grads(core, q, k, v, seg, window)
    assert out.shape == ref_out.shape and out.dtype == ref_out.dtype
    assert rel_l2(out, ref_out) <= tol, (mask, "out", rel_l2(out, ref_out))
    for name, a, b in zip("qkv", got_grads, ref_grads):
        assert rel_l2(a, b) <= tol, (mask, f"d{name}", rel_l2(a, b))


def test_masks_differ():
    """Guard against vacuous comparisons: each mask kind changes the reference output."""
    q, k, v, seg = attention_inputs(packed=True)
    outs = [
        NaiveAttention()(q, k, v, scale=0.25, window=w, segment_ids=s)
        for w, s in ((None, None), (5, None), (None, seg), (5, seg))
    ]
    for i in range(len(outs)):
        for j in range(i + 1, len(outs)):
            assert rel_l2(outs[i], outs[j]) > 1e-2


@pytest.mark.parametrize("mask", list(MASKS))
def test_sdpa(mask):
    _check_against_naive(SDPAttention(), mask)


@pytest.mark.parametrize("mask", list(MASKS))
def test_flex_forward(mask):
    _check_against_naive(FlexAttention(), mask, grads=False)


def test_flex_backward_on_cpu_is_a_clear_error():
    q, k, v, _ = attention_inputs()
    with pytest.raises(KernelUnavailable, match="no backward on CPU"):
        FlexAttention()(q, k, v, scale=0.25, window=None, segment_ids=None)


def test_splash_outside_tpu_is_a_clear_error():
    q, k, v, _ = attention_inputs()
    with pytest.raises(KernelUnavailable, match="needs device.type = tpu"):
        SplashAttention()(q, k, v, scale=0.25, window=None, segment_ids=None)


@pytest.mark.parametrize("mask", ["causal_gqa", "window", "segments", "window_segments_gqa"])
def test_tokamax(mask):
    pytest.importorskip("tokamax", reason="kernels.attention=tokamax needs the [jax] extra (jax + tokamax)")
    _check_against_naive(TokamaxAttention(), mask, seq=23, batch=1 if "segments" not in mask else 2)


def test_tokamax_bf16():
    pytest.importorskip("tokamax", reason="kernels.attention=tokamax needs the [jax] extra (jax + tokamax)")
    _check_against_naive(TokamaxAttention(), "window_segments_gqa", dtype=torch.bfloat16, tol=BF16_TOL, seq=23)


def test_splash_kernel_in_interpret_mode():
    """The splash Pallas kernel itself, run by the Pallas interpreter on CPU: GQA, window,
    packed documents and a length (37) padded up to its 128-token block, forward and backward."""
    pytest.importorskip("jax", reason="the splash kernel is written in JAX Pallas: needs the [jax] extra")
    _check_against_naive(SplashAttention(interpret=True), "window_segments_gqa", batch=1, seq=37)


def test_tokamax_without_jax_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "titan_core.kernels.tokamax_ops", None)  # import now fails
    q, k, v, _ = attention_inputs()
    with pytest.raises(KernelUnavailable, match=r"attention=tokamax needs jax and tokamax.*\[jax\]"):
        TokamaxAttention()(q, k, v, scale=0.25, window=None, segment_ids=None)


def test_sdpa_bf16_on_cpu_attends_in_fp32():
    """bf16 on a CPU attends on the values upcast to fp32 (attention._cpu_bf16): the result is fp32
    flash's on the same bf16 values, rounded once; its gradients are as near the fp64 truth as the bf16
    math backend's and nearer than the bf16 flash kernel's; fp32 is untouched."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from titan_core.models.common.attention import SDPAttention

    torch.manual_seed(0)
    q, k, v, g = (torch.randn(2, 4, 64, 16) for _ in range(4))
    core = SDPAttention()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def q_grad(f, dtype):
        qq, kk, vv = (x.to(dtype).detach().requires_grad_() for x in (q, k, v))
        out = f(qq, kk, vv)
        out.backward(g.to(dtype))
        return out, qq.grad.double()

    out, grad = q_grad(lambda a, b, c: core(a, b, c, scale=0.25, window=None, segment_ids=None), torch.bfloat16)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, sdpa(qb.float(), kb.float(), vb.float(), is_causal=True, scale=0.25).bfloat16())
    _, truth = q_grad(lambda a, b, c: sdpa(a, b, c, is_causal=True, scale=0.25), torch.float64)

    def err(x):
        return ((x - truth).norm() / truth.norm()).item()

    with sdpa_kernel(SDPBackend.MATH):
        assert err(grad) <= err(q_grad(lambda a, b, c: sdpa(a, b, c, is_causal=True, scale=0.25), torch.bfloat16)[1]) * 1.01
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert err(grad) < err(q_grad(lambda a, b, c: sdpa(a, b, c, is_causal=True, scale=0.25), torch.bfloat16)[1])
    assert torch.equal(core(q, k, v, scale=0.25, window=None, segment_ids=None), sdpa(q, k, v, is_causal=True, scale=0.25))


