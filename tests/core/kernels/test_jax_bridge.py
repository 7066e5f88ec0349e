"""The JAX bridge: custom-op contract (opcheck), compile without graph breaks, make_fx,
tokamax ops matching PyTorch, and the errors it raises."""

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import FP32_TOL, rel_l2

jax = pytest.importorskip("jax", reason="the JAX bridge needs the [jax] extra (jax + tokamax)")
pytest.importorskip("tokamax", reason="the JAX bridge tests use tokamax: needs the [jax] extra")
import jax.numpy as jnp  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from titan_core.kernels.jax_bridge import BridgeError, jax_op  # noqa: E402
from titan_core.kernels.tokamax_ops import linear_cross_entropy, ragged_dot, tokamax_attention  # noqa: E402


@jax_op("test_gated")
def gated(x: jax.Array, y: jax.Array, *, alpha: float) -> jax.Array:
    return jnp.sin(x) * y * alpha


@jax_op("test_two_outputs", nondiff=("ids",))
def two_outputs(x: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.tanh(x) + ids.astype(x.dtype), jnp.sum(x * x, axis=-1)


def _xy():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(5, 3, generator=gen, requires_grad=True), torch.randn(5, 3, generator=gen, requires_grad=True)


def test_matches_torch_values_and_grads():
    x, y = _xy()
    out, ref = gated(x, y, alpha=2.0), torch.sin(x) * y * 2.0
    assert rel_l2(out, ref) <= FP32_TOL
    for a, b in zip(torch.autograd.grad(out.sum(), (x, y)), torch.autograd.grad(ref.sum(), (x, y))):
        assert rel_l2(a, b) <= FP32_TOL


def test_several_outputs_int64_ids_and_an_unused_output():
    x, _ = _xy()
    ids = torch.arange(15).reshape(5, 3)  # int64: narrowed to JAX's int32 on the way in
    a, b = two_outputs(x, ids)
    assert rel_l2(a, torch.tanh(x) + ids) <= FP32_TOL and rel_l2(b, (x * x).sum(-1)) <= FP32_TOL
    (g,) = torch.autograd.grad(b.sum(), (x,))  # `a` gets no gradient: the bridge feeds zeros
    assert rel_l2(g, 2 * x) <= FP32_TOL


def test_opcheck():
    x, y = _xy()
    fwd, _ = gated.ops("dlpack")
    torch.library.opcheck(fwd, (x, y), {"alpha": 2.0})


def test_compile_fullgraph_without_graph_breaks():
    x, y = _xy()
    fn = lambda a, b: (gated(a, b, alpha=3.0) * 2).sum()  # noqa: E731
    explained = torch._dynamo.explain(fn)(x, y)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got, ref = compiled(x, y), fn(x, y)
    assert rel_l2(got, ref) <= FP32_TOL
    for a, b in zip(torch.autograd.grad(got, (x, y)), torch.autograd.grad(ref, (x, y))):
        assert rel_l2(a, b) <= FP32_TOL


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_make_fx_captures_forward_and_backward_ops(mode):
    x, y = _xy()

    def step(a, b):
        return torch.autograd.grad(gated(a, b, alpha=2.0).sum(), (a,))

    gm = make_fx(step, tracing_mode=mode)(x, y)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"titan.test_gated.default", "titan.test_gated_bwd.default"} <= targets
    if mode == "real":
        x2, y2 = torch.randn(5, 3), torch.randn(5, 3)  # new values flow through: nothing baked in
        assert rel_l2(gm(x2, y2)[0], 2 * torch.cos(x2) * y2) <= FP32_TOL


def test_tokamax_attention_matches_torch():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 11, 4, 8, generator=gen, requires_grad=True)  # [B, S, N, D]
    k = torch.randn(2, 11, 2, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, 11, 2, 8, generator=gen, requires_grad=True)
    seg = torch.tensor([[0] * 4 + [1] * 7, [0] * 11])
    out = tokamax_attention(q, k, v, seg, scale=0.3, window=4, implementation="xla")
    pos = torch.arange(11)
    mask = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < 4)
    mask = mask[None, None] & (seg[:, None, :, None] == seg[:, None, None, :])
    ref = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=0.3, enable_gqa=True
    ).transpose(1, 2)
    assert rel_l2(out, ref) <= FP32_TOL
    for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        assert rel_l2(a, b) <= FP32_TOL
    torch.library.opcheck(
        tokamax_attention.ops("dlpack")[0], (q, k, v, seg), {"scale": 0.3, "window": 4, "implementation": "xla"}
    )


def test_ragged_dot_matches_torch_with_an_empty_group():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(10, 16, generator=gen, requires_grad=True)
    w = torch.randn(3, 16, 8, generator=gen, requires_grad=True)
    sizes = torch.tensor([4, 0, 6])
    out = ragged_dot(x, w, sizes)
    ref = torch.cat([x[:4] @ w[0], x[4:] @ w[2]])
    assert rel_l2(out, ref) <= FP32_TOL
    cot = torch.randn(out.shape, generator=gen)
    gx, gw = torch.autograd.grad(out, (x, w), cot)
    rx, rw = torch.autograd.grad(ref, (x, w), cot)
    assert rel_l2(gx, rx) <= FP32_TOL and rel_l2(gw, rw) <= FP32_TOL and torch.count_nonzero(gw[1]) == 0
    torch.library.opcheck(ragged_dot.ops("dlpack")[0], (x, w, sizes), {"implementation": "xla"})


def test_linear_cross_entropy_matches_torch():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(10, 16, generator=gen, requires_grad=True)
    w = torch.randn(37, 16, generator=gen, requires_grad=True)  # vocab 37: nothing divides it
    labels = torch.randint(0, 37, (10,), generator=gen)
    out, ref = linear_cross_entropy(h, labels, w), F.cross_entropy(h @ w.t(), labels)
    assert rel_l2(out, ref) <= FP32_TOL
    for a, b in zip(torch.autograd.grad(out, (h, w)), torch.autograd.grad(ref, (h, w))):
        assert rel_l2(a, b) <= FP32_TOL


def test_signature_errors_are_clear():
    with pytest.raises(BridgeError, match="neither a positional jax.Array"):
        jax_op("test_bad_static")(lambda x, n: x)
    with pytest.raises(BridgeError, match="must be listed in nondiff"):

        @jax_op("test_optional_diff")
        def f(x: jax.Array, y: jax.Array | None) -> jax.Array:
            return x

    with pytest.raises(BridgeError, match="return annotation"):

        @jax_op("test_bad_return")
        def g(x: jax.Array) -> int:
            return 0


def test_tpu_registration_without_torch_tpu_is_a_clear_error():
    import sys

    if "torch_tpu" in sys.modules:
        pytest.skip("torch_tpu is loaded in this process: the error path does not apply")
    with pytest.raises(BridgeError, match="needs torch_tpu"):
        gated.ops("tpu")


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(BridgeError, match="does not pass torch.complex64"):
        gated(torch.randn(2, dtype=torch.complex64), torch.randn(2, dtype=torch.complex64), alpha=1.0)


@jax_op("test_pass_through")
def pass_through(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x, x + y


def test_outputs_never_alias_inputs_or_each_other():
    """JAX returns input buffers for pass-through outputs (and the same cotangent for both
    gradients of x + y): custom ops must not, so the bridge copies exactly those."""
    x, y = _xy()
    a, b = pass_through(x, y)
    assert a.data_ptr() != x.data_ptr() and torch.equal(a, x)
    gx, gy = torch.autograd.grad(b, (x, y), torch.ones(5, 3))
    assert gx.data_ptr() != gy.data_ptr() and torch.equal(gx, torch.ones(5, 3)) and torch.equal(gy, gx)
    torch.library.opcheck(pass_through.ops("dlpack")[0], (x, y))


def test_dlpack_is_zero_copy_both_ways():
    from titan_core.kernels.jax_bridge import _to_jax, _to_torch

    t = torch.randn(1000)
    assert _to_jax(t).unsafe_buffer_pointer() == t.data_ptr()
    a = jnp.arange(1000.0) * 2
    assert _to_torch([a], [])[0].data_ptr() == a.unsafe_buffer_pointer()
