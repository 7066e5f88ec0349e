"""Grouped expert kernels vs the per-expert loop: values, gradients, an expert with no tokens."""

import pytest
import torch
from kernel_helpers import BF16_TOL, FP32_TOL, rel_l2
from torch.fx.experimental.proxy_tensor import make_fx

from titan_core.config.sections import Kernels
from titan_core.models.common.swaps import apply_swaps
from titan_core.kernels import swaps_for
from titan_core.kernels.attention import KernelUnavailable
from titan_core.kernels.moe import GroupedMMExperts, TokamaxExperts, grouped_mm_unsupported, sort_by_expert
from titan_core.models import build_meta, resolve_args
from titan_core.models.common.moe import Experts

E, DIM, HIDDEN, TOKENS, TOP_K = 4, 16, 24, 13, 2
EMPTY = 2  # this expert gets no tokens


def _experts(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    ref = Experts(E, DIM, HIDDEN)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return ref.to(dtype)


def _routing(dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(TOKENS, DIM, generator=gen).to(dtype).requires_grad_()
    choices = torch.tensor([e for e in range(E) if e != EMPTY])
    experts = torch.stack([choices[torch.randperm(len(choices), generator=gen)[:TOP_K]] for _ in range(TOKENS)])
    weights = torch.softmax(torch.randn(TOKENS, TOP_K, generator=gen), -1).to(dtype).requires_grad_()
    return x, weights, experts


def _run(module, x, weights, experts):
    out = module(x, weights, experts)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.dtype)
    params = [module.w1, module.w3, module.w2]
    return (out, *torch.autograd.grad(out, [x, weights, *params], cot))


def _compare(kernel_cls, dtype, tol):
    ref = _experts(dtype)
    x, weights, experts = _routing(dtype)
    assert (experts == EMPTY).sum() == 0
    want = _run(ref, x, weights, experts)
    kernel = kernel_cls(ref)
    assert kernel.w1 is ref.w1 and kernel.w2 is ref.w2  # same parameters: state dict unchanged
    got = _run(kernel, x, weights, experts)
    for name, a, b in zip(("out", "dx", "dweights", "dw1", "dw3", "dw2"), got, want):
        assert rel_l2(a, b) <= tol, (name, rel_l2(a, b))
    for g in got[3:]:  # the empty expert's weights get an exact zero gradient, not garbage
        assert torch.count_nonzero(g[EMPTY]) == 0


def test_sort_by_expert_counts_and_order():
    experts = torch.tensor([[3, 0], [0, 1], [3, 1]])
    order, token, counts = sort_by_expert(experts, 5)
    assert counts.tolist() == [2, 2, 0, 2, 0]
    assert experts.reshape(-1)[order].tolist() == [0, 0, 1, 1, 3, 3]
    assert token.tolist() == [0, 1, 1, 2, 0, 2]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32_TOL), (torch.bfloat16, BF16_TOL)])
def test_grouped_mm(dtype, tol):
    _compare(GroupedMMExperts, dtype, tol)


def test_grouped_mm_misaligned_rows_are_a_clear_error():
    """torch._grouped_mm needs 16-byte rows: dim 10 in fp32 is 40 bytes."""
    ref = Experts(2, 10, 8)
    x = torch.randn(3, 10)
    with pytest.raises(KernelUnavailable, match="multiple of 16 bytes; dim=10"):
        GroupedMMExperts(ref)(x, torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.long))
    assert grouped_mm_unsupported("cpu", torch.float32, 16, 24) is None
    assert "CPU and CUDA only" in grouped_mm_unsupported("meta", torch.float32, 16, 24)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32_TOL), (torch.bfloat16, BF16_TOL)])
def test_tokamax(dtype, tol):
    pytest.importorskip("tokamax", reason="kernels.moe=tokamax needs the [jax] extra (jax + tokamax)")
    _compare(TokamaxExperts, dtype, tol)


def test_swaps_replace_every_moe_layer_and_nothing_else():
    args = resolve_args("qwen3_moe", "debugmodel", {"n_layers": 3, "dense_layers": [1]})
    model = build_meta("qwen3_moe", args)
    keys = {k: v.shape for k, v in model.state_dict().items()}
    claimed = apply_swaps(model, swaps_for(Kernels(moe="grouped_mm")))
    assert claimed == {"layers.0.moe.experts": "moe.grouped_mm", "layers.2.moe.experts": "moe.grouped_mm"}
    assert isinstance(model.layers["2"].moe.experts, GroupedMMExperts)
    assert {k: v.shape for k, v in model.state_dict().items()} == keys
    assert swaps_for(Kernels(moe="tokamax")) == ["moe.tokamax"]


def _trace(module, *inputs):
    """make_fx in fake mode with the parameters as graph inputs, as the Graph Trainer does."""
    params = dict(module.named_parameters())
    fn = lambda p, *a: torch.func.functional_call(module, p, a)  # noqa: E731
    return make_fx(fn, tracing_mode="fake")(params, *inputs)


def test_grouped_mm_is_capture_friendly_in_bf16():
    """No data-dependent shapes or host syncs: one graph under compile, traceable by make_fx."""
    ref = _experts(torch.bfloat16)
    x, weights, experts = _routing(torch.bfloat16)
    kernel = GroupedMMExperts(ref)
    explained = torch._dynamo.explain(kernel)(x, weights, experts)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    gm = _trace(kernel, x, weights, experts)
    assert "aten._grouped_mm.default" in {str(n.target) for n in gm.graph.nodes}
    compiled = torch.compile(kernel, fullgraph=True, backend="aot_eager")
    assert rel_l2(compiled(x, weights, experts), kernel(x, weights, experts)) == 0.0


def test_grouped_mm_fp32_cannot_be_captured_and_says_so():
    """torch 2.13 runs fp32 grouped_mm eagerly on CPU (tested above) but its meta function,
    which compile and make_fx use, takes bf16 only: say that instead of torch's bare check."""
    kernel = GroupedMMExperts(_experts())
    x, weights, experts = _routing()
    with pytest.raises(KernelUnavailable, match="bf16 only under torch.compile / make_fx"):
        _trace(kernel, x, weights, experts)
    assert "bf16 only on CUDA" in grouped_mm_unsupported("cuda", torch.float32, 16, 24)
    assert grouped_mm_unsupported("cpu", torch.float32, 16, 24, captured=False) is None
