"""titan_core/runtime/cpu_bf16.py: on a CPU without bf16 gemm instructions, bf16 products are fp32 products
of the same values rounded once, which is what torch's own kernel computes, but for the order of its sums.
Each comparison is against torch's kernel (`disable()`), on fresh random inputs."""

from __future__ import annotations

import itertools
import subprocess
import sys
import zlib

import pytest
import torch
import torch.nn.functional as F

from titan_core.measure.numerics import rel_l2
from titan_core.runtime import cpu_bf16

BF16_STEP = 2.0**-8
"""bf16's relative spacing: two roundings of nearly the same fp32 sum differ by at most one step."""

NATIVE = cpu_bf16.bf16_gemm_is_native()
"""Whether this CPU's bf16 gemm is oneDNN's (the registration is then never made outside these tests)."""


@pytest.fixture(autouse=True)
def _restored(monkeypatch):
    """The registration is made on any CPU here (where torch's bf16 gemm is native, it is compared with
    oneDNN's kernel); each test leaves the process's choice as it found it (tests/conftest.py enables it)."""
    was = cpu_bf16.enabled()
    monkeypatch.setattr(cpu_bf16, "bf16_gemm_is_native", lambda: False)
    yield
    monkeypatch.undo()
    if was:
        cpu_bf16.enable()
    else:
        cpu_bf16.disable()


def _operands(name: str, dtype: torch.dtype, g: torch.Generator) -> tuple:
    r = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    return {
        "mm": (r(48, 300), r(300, 40)),
        "addmm": (r(40), r(48, 300), r(300, 40)),
        "bmm": (r(3, 48, 300), r(3, 300, 40)),
        "baddbmm": (r(3, 48, 40), r(3, 48, 300), r(3, 300, 40)),
        "linear": (r(2, 24, 300), r(40, 300), r(40)),
        "matmul": (r(2, 24, 300), r(300, 40)),
    }[name]


OPS = {
    "mm": torch.mm,
    "addmm": lambda bias, a, b: torch.addmm(bias, a, b, beta=0.5, alpha=2.0),
    "bmm": torch.bmm,
    "baddbmm": lambda bias, a, b: torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0),
    "linear": F.linear,
    "matmul": torch.matmul,
}


def _both(op, args) -> tuple[torch.Tensor, torch.Tensor]:
    """(torch's kernel, the fp32 products) of one call."""
    cpu_bf16.disable()
    torch_kernel = op(*args)
    assert cpu_bf16.enable()
    return torch_kernel, op(*args)


@pytest.mark.parametrize("name", list(OPS))
def test_a_bf16_product_is_torchs_but_for_the_order_of_its_sums(name):
    args = _operands(name, torch.bfloat16, torch.Generator().manual_seed(zlib.crc32(name.encode())))
    torch_kernel, products = _both(OPS[name], args)
    assert products.dtype == torch.bfloat16 and products.shape == torch_kernel.shape
    exact = OPS[name](*(a.double() for a in args))
    # both are the exact product rounded to bf16 once, each within one bf16 step of it
    assert rel_l2(torch_kernel, exact) <= BF16_STEP and rel_l2(products, exact) <= BF16_STEP
    # and they round the same almost everywhere
    differ = products != torch_kernel
    assert differ.float().mean() <= 0.01, f"{int(differ.sum())} of {differ.numel()} outputs differ"
    # where they differ, by at most a step each of the terms' size (the sum of the terms' magnitudes: where
    # they cancel, one fp32 rounding of a term moves a small result by more than a step of itself)
    scale = OPS[name](*(a.double().abs() for a in args))
    assert bool(((products.double() - torch_kernel.double()).abs() <= 2 * BF16_STEP * scale).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_other_dtypes_are_torchs_kernel_bit_for_bit(name, dtype):
    args = _operands(name, dtype, torch.Generator().manual_seed(7))
    torch_kernel, products = _both(OPS[name], args)
    assert products.dtype == dtype and torch.equal(products, torch_kernel)


def test_the_backward_of_a_bf16_linear_goes_through_it_too():
    g = torch.Generator().manual_seed(3)
    x0, w0 = torch.randn(16, 300, generator=g), torch.randn(40, 300, generator=g)
    grads = {}
    for path in ("torch_kernel", "products"):
        if path == "torch_kernel":
            cpu_bf16.disable()
        else:
            cpu_bf16.enable()
        x, w = x0.bfloat16().requires_grad_(), w0.bfloat16().requires_grad_()
        (F.linear(x, w).float() ** 2).sum().backward()
        grads[path] = (x.grad, w.grad)
    for a, b in zip(grads["products"], grads["torch_kernel"]):
        assert a.dtype == torch.bfloat16 and rel_l2(a, b) <= BF16_STEP


SHAPES = {  # name: its operands' shapes, then the same with the inner sizes mismatched
    "mm": ([(4, 3), (3, 5)], [(4, 3), (2, 5)]),
    "addmm": ([(5,), (4, 3), (3, 5)], [(5,), (4, 3), (2, 5)]),
    "bmm": ([(2, 4, 3), (2, 3, 5)], [(2, 4, 3), (2, 2, 5)]),
    "baddbmm": ([(2, 4, 5), (2, 4, 3), (2, 3, 5)], [(2, 4, 5), (2, 4, 3), (2, 2, 5)]),
    "linear": ([(4, 3), (5, 3), (5,)], [(4, 3), (5, 2), (5,)]),
    "matmul": ([(2, 4, 3), (3, 5)], [(2, 4, 3), (2, 5)]),
}


def _outcome(op, args) -> tuple:
    try:
        return ("result", op(*args).dtype)
    except RuntimeError as e:
        return ("RuntimeError", str(e))


@pytest.mark.parametrize("name", list(SHAPES))
def test_mixed_dtypes_and_bad_shapes_keep_torchs_refusal_word_for_word(name):
    """An fp32 weight against bf16 activations is a bug the model must hear of as torch says it, never a
    product: every bf16/fp32 mix of the operands, and mismatched sizes, end as they do in torch's kernel."""
    refused = 0
    for shapes in SHAPES[name]:
        for dtypes in itertools.product((torch.bfloat16, torch.float32), repeat=len(shapes)):
            args = [torch.randn(*shape).to(dtype) for shape, dtype in zip(shapes, dtypes)]
            cpu_bf16.disable()
            want = _outcome(OPS[name], args)
            assert cpu_bf16.enable()
            assert _outcome(OPS[name], args) == want, dtypes
            refused += want[0] == "RuntimeError"
    assert refused > 2 ** len(SHAPES[name][0])  # every mix of the mismatched shapes, and some of the others


def test_nothing_is_replaced_where_torchs_bf16_gemm_is_native(monkeypatch):
    cpu_bf16.disable()
    monkeypatch.setattr(cpu_bf16, "bf16_gemm_is_native", lambda: True)
    assert cpu_bf16.enable() is False and not cpu_bf16.enabled()


WORKER = """
import sys
from titan_core.config import load_config
from titan_core.runtime import cpu_bf16
from titan_core.training.trainer import Trainer

for dtype in sys.argv[2:]:
    cfg = load_config(None, ["--model.family=llama3", "--model.flavor=debugmodel", "--device.type=cpu",
                             "--parallelism.data_parallel=none", f"--training.dtype={dtype}",
                             f"--metrics.output_dir={sys.argv[1]}/{dtype}"])
    Trainer(cfg, quiet=True)
    print(dtype, cpu_bf16.enabled())
"""


def test_a_bf16_trainer_on_the_cpu_enables_it_and_an_fp32_one_does_not(tmp_path):
    """In a fresh process: the fp32 run leaves torch's kernels (no Python call on its products), the bf16 one
    replaces them before it builds its model."""
    argv = [sys.executable, "-c", WORKER, str(tmp_path), "float32", "bfloat16"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["float32 False", f"bfloat16 {not NATIVE}"]  # never where the gemm is native
