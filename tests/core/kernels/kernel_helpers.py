"""Shared by the kernel tests: tolerances and small random attention inputs (the relative
L2 error is titan_core.measure.numerics.rel_l2, re-exported here for the tests that import it from here)."""

from __future__ import annotations

import torch

from core_bounds import KERNEL_FP32_REL
from titan_core.measure.numerics import rel_l2  # noqa: F401

FP32_TOL = KERNEL_FP32_REL
"""The kernels gate's fp32 bound (checklists/kernels.yaml: output and grads vs the plain path)."""
BF16_TOL = 1e-2

# name -> (window, packed documents, kv heads): every mask kind, GQA included
MASKS = {
    "causal": (None, False, 4),
    "causal_gqa": (None, False, 2),
    "window": (5, False, 2),
    "segments": (None, True, 4),
    "window_segments_gqa": (5, True, 1),
}


def attention_inputs(*, batch=2, heads=4, kv_heads=4, seq=37, head_dim=16, dtype=torch.float32, packed=False, seed=0):
    """q [B, N, S, D], k/v [B, K, S, D] requiring grad; segment ids with 3 documents per row when packed."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, head_dim, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(batch, kv_heads, seq, head_dim, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(batch, kv_heads, seq, head_dim, generator=gen).to(dtype).requires_grad_()
    seg = None
    if packed:
        cuts = torch.tensor([[5, 20], [11, 30]])[:batch]
        pos = torch.arange(seq)[None, :]
        seg = (pos >= cuts[:, :1]).long() + (pos >= cuts[:, 1:]).long()
    return q, k, v, seg


def out_and_grads(core, q, k, v, seg, window, *, scale=0.25, seed=1):
    """Output and grads of (q, k, v) against a fixed random cotangent."""
    out = core(q, k, v, scale=scale, window=window, segment_ids=seg)
    gen = torch.Generator().manual_seed(seed)
    cot = torch.randn(out.shape, generator=gen).to(out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), cot)
    return out, grads
