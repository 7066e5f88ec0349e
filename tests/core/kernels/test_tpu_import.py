"""TPU registrations (torch.tpu.pallas.jax_op) build, and fake-tensor calls give the right shapes.

Runs only where torch-tpu is installed (a CPU machine is enough: nothing executes on a TPU,
the ops are traced and exported for the TPU platform). Never in CI: torch_tpu auto-loads
into `import torch` and aborts the process when a TPU is asked for and absent.
"""

import pytest
import torch

pytestmark = pytest.mark.tpu_import

pytest.importorskip(
    "torch_tpu",
    reason="torch-tpu is not installed (pip install 'titan-onboard[tpu]'); TPU-host-only check, never in CI",
)
pytest.importorskip("tokamax", reason="the TPU registrations wrap tokamax and splash: needs the [jax] extra")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from titan_core.kernels.splash import splash_attention  # noqa: E402
from titan_core.kernels.tokamax_ops import linear_cross_entropy, ragged_dot, tokamax_attention  # noqa: E402


def _fake_call(bridged, shapes, dtypes, statics, n_grads):
    """Forward and (through autograd) backward of the TPU registration on fake tensors."""
    fwd, _ = bridged.ops("tpu")
    with FakeTensorMode():
        args = [
            None
            if s is None
            else (
                torch.empty(s, dtype=d, requires_grad=d.is_floating_point)
                if d.is_floating_point
                else torch.zeros(s, dtype=d)
            )
            for s, d in zip(shapes, dtypes)
        ]
        out = fwd(*args, **statics)
        diff = [a for a in args if a is not None and a.requires_grad]
        grads = torch.autograd.grad(out.sum(), diff)
    assert len(grads) == n_grads
    for g, a in zip(grads, diff):
        assert g.shape == a.shape and g.dtype == a.dtype
    return out


def test_registrations_build_with_tpu_names():
    for bridged in (tokamax_attention, ragged_dot, linear_cross_entropy, splash_attention):
        fwd, bwd = bridged.ops("tpu")
        assert (fwd._namespace, bwd._namespace) == ("titan_tpu", "titan_tpu")
        assert bwd._name == fwd._name + "_bwd"


def test_tokamax_attention_fake_shapes():
    bf16, i32 = torch.bfloat16, torch.int32
    out = _fake_call(
        tokamax_attention,
        [(2, 256, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64), (2, 256)],
        [bf16, bf16, bf16, i32],
        {"scale": 0.125, "window": 128, "implementation": "xla"},
        n_grads=3,
    )
    assert out.shape == (2, 256, 8, 64) and out.dtype == bf16


def test_ragged_dot_fake_shapes():
    out = _fake_call(
        ragged_dot,
        [(64, 128), (4, 128, 256), (4,)],
        [torch.bfloat16, torch.bfloat16, torch.int32],
        {"implementation": "xla"},
        n_grads=2,
    )
    assert out.shape == (64, 256)


def test_linear_cross_entropy_fake_shapes():
    out = _fake_call(
        linear_cross_entropy,
        [(64, 128), (64,), (1000, 128)],
        [torch.float32, torch.int32, torch.float32],
        {"implementation": "xla"},
        n_grads=2,
    )
    assert out.shape == ()


def test_splash_attention_fake_shapes():
    bf16 = torch.bfloat16
    out = _fake_call(
        splash_attention,
        [(1, 8, 300, 128), (1, 2, 300, 128), (1, 2, 300, 128), (1, 300)],
        [bf16, bf16, bf16, torch.int32],
        {"scale": 0.088, "window": 0, "interpret": False},
        n_grads=3,
    )
    assert out.shape == (1, 8, 300, 128) and out.dtype == bf16
