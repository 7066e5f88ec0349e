"""Decoder layers against references written out here, loop by loop.

Attention: explicit per-head loops, kv head h // group for query head h (GQA), per-head
RMSNorm (QK-norm), the RoPE rotation of each (i, i + d/2) pair by position * theta^(-2i/d),
and an explicit causal / sliding-window mask. MoE: every expert run on every token and
combined through a dense routing matrix.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from titan_core.models.common.attention import Attention
from titan_core.models.common.layers import rope_cos_sin, rope_inv_freq
from titan_core.models.common.moe import MoE, Experts
from titan_core.models.registry import build_meta

THETA = 10000.0


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out - ref).norm() / ref.norm()).item()


def randomize_(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)


def rotate_pairs(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [batch, seq, head_dim]; element i pairs with i + d/2, rotated by pos * theta^(-2i/d)."""
    d = x.shape[-1]
    out = x.clone()
    for pos in range(x.shape[1]):
        for i in range(d // 2):
            angle = pos * theta ** (-2 * i / d)
            a, b = x[:, pos, i], x[:, pos, i + d // 2]
            out[:, pos, i] = a * math.cos(angle) - b * math.sin(angle)
            out[:, pos, i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def reference_attention(mod: Attention, x: torch.Tensor) -> torch.Tensor:
    b, s, _ = x.shape
    n_h, n_kv, d = mod.n_heads, mod.n_kv_heads, mod.head_dim
    q = F.linear(x, mod.wq.weight, mod.wq.bias).view(b, s, n_h, d)
    k = F.linear(x, mod.wk.weight, mod.wk.bias).view(b, s, n_kv, d)
    v = F.linear(x, mod.wv.weight, mod.wv.bias).view(b, s, n_kv, d)
    heads = []
    for h in range(n_h):
        g = h // (n_h // n_kv)
        qh, kh, vh = q[:, :, h], k[:, :, g], v[:, :, g]
        if mod.q_norm is not None:
            qh = qh / torch.sqrt(qh.pow(2).mean(-1, keepdim=True) + mod.q_norm.eps) * mod.q_norm.weight
            kh = kh / torch.sqrt(kh.pow(2).mean(-1, keepdim=True) + mod.k_norm.eps) * mod.k_norm.weight
        if mod.use_rope:
            qh, kh = rotate_pairs(qh, THETA), rotate_pairs(kh, THETA)
        scores = qh @ kh.transpose(1, 2) / math.sqrt(d)
        mask = torch.zeros(s, s, dtype=torch.bool)
        for i in range(s):
            for j in range(s):
                mask[i, j] = j <= i and (mod.window is None or i - j < mod.window)
        scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ vh)
    return F.linear(torch.cat(heads, dim=-1), mod.wo.weight, mod.wo.bias)


ATTENTION_CASES = {
    "mha": dict(n_heads=4, n_kv_heads=4),
    "gqa": dict(n_heads=8, n_kv_heads=2),
    "mqa": dict(n_heads=4, n_kv_heads=1),
    "sliding_window": dict(n_heads=4, n_kv_heads=2, window=7),
    "window_of_one": dict(n_heads=4, n_kv_heads=2, window=1),
    "qk_norm": dict(n_heads=4, n_kv_heads=2, qk_norm=True),
    "rope_skip": dict(n_heads=4, n_kv_heads=2, use_rope=False),
    "everything": dict(n_heads=8, n_kv_heads=2, qk_norm=True, window=5, use_rope=False, qkv_bias=True, out_bias=True),
}


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention_matches_reference(case):
    dim, head_dim, seq = 48, 16, 24
    mod = Attention(dim, head_dim=head_dim, norm_eps=1e-6, **ATTENTION_CASES[case])
    randomize_(mod, seed=0)
    x = torch.randn(2, seq, dim, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(seq).expand(2, -1)
    cos, sin = rope_cos_sin(rope_inv_freq(head_dim, THETA), positions, x.dtype)
    with torch.no_grad():
        out, ref = mod(x, cos, sin), reference_attention(mod, x)
    assert rel_err(out, ref) <= 1e-5


def test_attention_mask_is_not_vacuous():
    """A window or RoPE skip must change the output; otherwise the cases above prove nothing."""
    dim, head_dim, seq = 48, 16, 24
    x = torch.randn(2, seq, dim, generator=torch.Generator().manual_seed(1))
    cos, sin = rope_cos_sin(rope_inv_freq(head_dim, THETA), torch.arange(seq).expand(2, -1), x.dtype)
    outs = {}
    for name, kw in {"plain": {}, "window": {"window": 7}, "nope": {"use_rope": False}}.items():
        mod = Attention(dim, 4, 2, head_dim, **kw)
        randomize_(mod, seed=0)
        with torch.no_grad():
            outs[name] = mod(x, cos, sin)
    assert rel_err(outs["window"], outs["plain"]) > 1e-2
    assert rel_err(outs["nope"], outs["plain"]) > 1e-2
    # the first 7 positions see the same keys with or without the window
    assert rel_err(outs["window"][:, :7], outs["plain"][:, :7]) <= 1e-6


def test_nope_layers_ignore_token_order():
    """Without RoPE, one causal layer at position t sees a set of earlier tokens, not an
    order: swapping two earlier tokens leaves the last position unchanged. With RoPE it
    does not. (One layer: deeper, earlier positions already differ by what they saw.)"""
    from titan_core.models.common.args import TransformerArgs

    def last_logits(rope_skip_every: int, tokens):
        args = TransformerArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_hidden_dim=128,
                               rope_skip_every=rope_skip_every)  # fmt: skip
        model = build_meta("glimmer", args)
        model.to_empty(device="cpu")
        model.init_weights(seed=0)
        randomize_(model, seed=0)  # O(1) scores: the default init makes attention nearly uniform
        with torch.no_grad():
            return model(tokens)[:, -1]

    tokens = torch.tensor([[5, 9, 13, 2, 7, 11]])
    swapped = tokens[:, [1, 0, 2, 3, 4, 5]]
    torch.testing.assert_close(last_logits(1, tokens), last_logits(1, swapped), rtol=1e-5, atol=1e-6)
    assert rel_err(last_logits(0, tokens), last_logits(0, swapped)) > 1e-2


# ---- MoE ------------------------------------------------------------------------------
def dense_experts(ex: Experts, x, weights, experts):
    """Every expert on every token; a [tokens, experts] matrix keeps the routed ones."""
    n_experts = ex.w1.shape[0]
    gate = torch.zeros(x.shape[0], n_experts).scatter(1, experts, weights)
    all_out = torch.stack([(F.silu(x @ ex.w1[e]) * (x @ ex.w3[e])) @ ex.w2[e] for e in range(n_experts)])
    return (gate.T[:, :, None] * all_out).sum(0)


def make_experts(n_experts=8, dim=32, hidden=48, seed=0):
    ex = Experts(n_experts, dim, hidden)
    randomize_(ex, seed)
    return ex


def routing(tokens, n_experts, top_k, seed, allowed=None):
    gen = torch.Generator().manual_seed(seed)
    pool = allowed if allowed is not None else list(range(n_experts))
    experts = torch.stack([torch.tensor(pool)[torch.randperm(len(pool), generator=gen)[:top_k]] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    return weights, experts


def test_expert_loop_matches_dense_reference():
    ex = make_experts()
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    weights, experts = routing(64, 8, 2, seed=2)
    weights.requires_grad_(True)
    out = ex(x, weights, experts)
    ref = dense_experts(ex, x, weights, experts)
    assert rel_err(out, ref) <= 1e-5
    grads = torch.autograd.grad(out.square().sum(), [x, weights, ex.w1, ex.w2, ex.w3])
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, weights, ex.w1, ex.w2, ex.w3])
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) <= 1e-5


def test_expert_with_no_tokens():
    """Routing never picks experts 6 and 7: output still matches, their grads are exactly 0."""
    ex = make_experts()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    weights, experts = routing(16, 8, 2, seed=3, allowed=[0, 1, 2, 3, 4, 5])
    out = ex(x, weights, experts)
    assert rel_err(out, dense_experts(ex, x, weights, experts)) <= 1e-5
    out.square().sum().backward()
    for p in (ex.w1, ex.w2, ex.w3):
        assert torch.isfinite(p.grad).all()
        assert torch.count_nonzero(p.grad[6:]) == 0 and torch.count_nonzero(p.grad[:6]) > 0


def test_single_token_batch():
    ex = make_experts()
    x = torch.randn(1, 32, generator=torch.Generator().manual_seed(4))
    weights, experts = routing(1, 8, 2, seed=5)
    assert rel_err(ex(x, weights, experts), dense_experts(ex, x, weights, experts)) <= 1e-5


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("shared", [0, 40])
def test_moe_layer_matches_reference(norm_topk_prob, shared):
    moe = MoE(32, 48, 8, 2, norm_topk_prob=norm_topk_prob, shared_hidden_dim=shared)
    randomize_(moe, seed=6)
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out, aux = moe(x)
        flat = x.reshape(-1, 32)
        probs = torch.softmax(flat @ moe.router.gate.weight.T, dim=-1)
        weights, experts = probs.topk(2, dim=-1)
        if norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        ref = dense_experts(moe.experts, flat, weights, experts)
        if shared:
            se = moe.shared_expert
            ref = ref + (F.silu(flat @ se.w1.weight.T) * (flat @ se.w3.weight.T)) @ se.w2.weight.T
        routed = torch.zeros(flat.shape[0], 8).scatter(1, experts, 1.0)
        ref_aux = torch.stack((routed.mean(0), probs.mean(0)))  # the layer's routing statistics
    assert rel_err(out.reshape(-1, 32), ref) <= 1e-5
    torch.testing.assert_close(aux, ref_aux, rtol=1e-5, atol=0)


def test_balanced_routing_aux_loss_is_top_k():
    """Switch loss = top_k when tokens and probabilities are spread evenly."""
    from titan_core.models.common.moe import load_balancing_loss, routing_stats

    probs = torch.full((8, 4), 0.25)
    experts = torch.tensor([[0, 1], [2, 3]] * 4)
    assert load_balancing_loss(routing_stats(probs, experts, 4), 1).item() == pytest.approx(2.0)
