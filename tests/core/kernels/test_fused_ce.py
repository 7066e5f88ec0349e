"""Fused linear cross-entropy vs the plain path: values, gradients, odd sizes, compile, make_fx."""

import pytest
import torch
from kernel_helpers import BF16_TOL, FP32_TOL, rel_l2
from torch.fx.experimental.proxy_tensor import make_fx

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Kernels
from titan_core.models.common.swaps import apply_swaps
from titan_core.kernels import swaps_for
from titan_core.kernels.fused_ce import FusedCrossEntropyHead, fused_linear_cross_entropy, reference_cross_entropy
from titan_core.models import build_meta, resolve_args


def _inputs(tokens=37, dim=24, vocab=101, dtype=torch.float32, seed=0, ignored=5):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, dim, generator=gen).to(dtype).requires_grad_()
    w = (torch.randn(vocab, dim, generator=gen) * 0.3).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    labels[torch.randperm(tokens, generator=gen)[:ignored]] = -100
    return h, w, labels


def _loss_and_grads(fn, h, w, labels, **kw):
    loss = fn(h, w, labels, **kw)
    return (loss, *torch.autograd.grad(loss, (h, w)))


@pytest.mark.parametrize("chunk", [1, 8, 37, 512])  # 37 tokens: never a multiple of 8; chunk > tokens
@pytest.mark.parametrize("cap,z_loss", [(None, 0.0), (5.0, 0.0), (None, 1e-3), (5.0, 1e-2)])
def test_matches_plain_path_fp32(chunk, cap, z_loss):
    h, w, labels = _inputs()
    ref = _loss_and_grads(reference_cross_entropy, h, w, labels, final_softcap=cap, z_loss=z_loss)
    got = _loss_and_grads(fused_linear_cross_entropy, h, w, labels, chunk=chunk, final_softcap=cap, z_loss=z_loss)
    for name, a, b in zip(("loss", "d_hidden", "d_weight"), got, ref):
        assert rel_l2(a, b) <= FP32_TOL, (name, rel_l2(a, b))


def test_matches_plain_path_bf16_and_accumulates_in_fp32():
    h, w, labels = _inputs(tokens=64, dim=32, vocab=300, dtype=torch.bfloat16)
    ref = _loss_and_grads(reference_cross_entropy, h, w, labels, final_softcap=5.0)
    got = _loss_and_grads(fused_linear_cross_entropy, h, w, labels, chunk=16, final_softcap=5.0)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.bfloat16
    for name, a, b in zip(("loss", "d_hidden", "d_weight"), got, ref):
        assert rel_l2(a, b) <= BF16_TOL, (name, rel_l2(a, b))


def test_batched_hidden_and_grad_scaling():
    """[batch, seq, dim] inputs, and a loss scaled after the head (grad accumulation does this)."""
    h, w, labels = _inputs(tokens=30)
    h3 = h.detach().reshape(3, 10, -1).requires_grad_()
    ref = _loss_and_grads(lambda *a: 0.25 * reference_cross_entropy(*a), h3, w, labels.reshape(3, 10))
    got = _loss_and_grads(lambda *a: 0.25 * fused_linear_cross_entropy(*a, chunk=7), h3, w, labels.reshape(3, 10))
    for a, b in zip(got, ref):
        assert rel_l2(a, b) <= FP32_TOL


def test_without_grad_only_the_loss():
    h, w, labels = _inputs()
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h, w, labels, chunk=8)
    assert loss.grad_fn is None
    assert rel_l2(loss, reference_cross_entropy(h, w, labels)) <= FP32_TOL


def test_only_weight_needs_grad():
    h, w, labels = _inputs()
    h = h.detach()
    (gw,) = torch.autograd.grad(fused_linear_cross_entropy(h, w, labels, chunk=8), (w,))
    (rw,) = torch.autograd.grad(reference_cross_entropy(h, w, labels), (w,))
    assert rel_l2(gw, rw) <= FP32_TOL


def test_second_backward_through_the_same_graph_raises():
    """Gradients are computed in the forward and scaled in place: a silent second pass would be wrong."""
    h, w, labels = _inputs()
    loss = fused_linear_cross_entropy(h, w, labels, chunk=8)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_bad_chunk_is_a_clear_error():
    h, w, labels = _inputs()
    with pytest.raises(ValueError, match="ce_chunk must be positive"):
        fused_linear_cross_entropy(h, w, labels, chunk=0)
    with pytest.raises(ConfigError, match="ce_chunk"):
        swaps_for(Kernels(loss="fused_ce", ce_chunk=0))


def test_torch_compile_fullgraph():
    h, w, labels = _inputs(tokens=20, vocab=50)
    head = FusedCrossEntropyHead(final_softcap=5.0, chunk=8)
    compiled = torch.compile(head, fullgraph=True, backend="aot_eager")
    got = _loss_and_grads(compiled, h, w, labels)
    ref = _loss_and_grads(reference_cross_entropy, h, w, labels, final_softcap=5.0)
    for a, b in zip(got, ref):
        assert rel_l2(a, b) <= FP32_TOL


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_make_fx_traces_forward_and_backward(mode):
    """As the Graph Trainer captures it: loss + autograd.grad in one traced function."""
    h, w, labels = _inputs(tokens=20, vocab=50)

    def step(h, w, labels):
        loss = fused_linear_cross_entropy(h, w, labels, chunk=8, z_loss=1e-3)
        return (loss, *torch.autograd.grad(loss, (h, w)))

    gm = make_fx(step, tracing_mode=mode)(h, w, labels)
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    # 3 chunks x the plain path's 3 matmuls (logits, d_hidden, d_weight) and no more
    assert ops.count("aten.mm.default") == 6 and ops.count("aten.addmm_.default") == 3
    if mode == "real":
        h2, w2, labels2 = _inputs(tokens=20, vocab=50, seed=3)  # new values: nothing baked in
        for a, b in zip(gm(h2, w2, labels2), _loss_and_grads(reference_cross_entropy, h2, w2, labels2, z_loss=1e-3)):
            assert rel_l2(a, b) <= FP32_TOL


def test_swap_on_a_model_matches_plain_and_keeps_state_dict():
    args = resolve_args("glimmer", "debugmodel", {"n_layers": 2, "vocab_size": 1000})  # soft-capped, tied
    plain, fused = build_meta("glimmer", args), build_meta("glimmer", args)
    claimed = apply_swaps(fused, swaps_for(Kernels(loss="fused_ce", ce_chunk=24)))
    assert claimed == {"loss_head": "loss.fused_ce(chunk=24)"}
    assert isinstance(fused.loss_head, FusedCrossEntropyHead) and fused.loss_head.final_softcap == 30.0
    for m in (plain, fused):
        m.to_empty(device="cpu")
        m.init_weights(seed=0)
    assert plain.state_dict().keys() == fused.state_dict().keys()
    tokens = torch.randint(0, 1000, (2, 33), generator=torch.Generator().manual_seed(0))
    results = []
    for m in (plain, fused):
        loss, _ = m.loss(tokens[:, :-1], tokens[:, 1:])
        results.append((loss, *torch.autograd.grad(loss, [m.tok_embeddings.weight, m.layers["0"].attention.wq.weight])))
    for a, b in zip(results[1], results[0]):
        assert rel_l2(a, b) <= FP32_TOL


def test_z_loss_with_the_plain_head_uses_the_reference_swap():
    names = swaps_for(Kernels(z_loss=1e-4))
    assert names == ["loss.plain(z_loss=0.0001)"]
    assert swaps_for(Kernels(loss="fused_ce", z_loss=1e-4)) == ["loss.fused_ce(z_loss=0.0001)"]
    with pytest.raises(ConfigError, match="z_loss"):
        swaps_for(Kernels(z_loss=-1.0))
