"""bf16 matrix products on a CPU without bf16 instructions: fp32 products of the same values, rounded once.

Where oneDNN has no bf16 kernel for the CPU (no AVX512-BF16, AMX or Arm bf16: `bf16_gemm_is_native()`),
torch's bf16 gemm is a scalar loop: on the 2-core AVX2 machine the suite runs on, a 256x256 @ 256x1024
product took 115 ms against fp32's 2 ms, and a bf16 training step of the llama3 debugmodel 5.5 s against
0.31 s. That loop accumulates in fp32 and rounds the result to bf16 once; so does an fp32 product of the
operands upcast (exactly: every bf16 value is an fp32 value) rounded to bf16, in sgemm's time (2.3 ms; the
debugmodel's bf16 step 0.63 s; bench/cpu_bf16_matmul.py: its forward and backward at seq 512 13.1x faster,
99% CI 12.1-14.2x). The two differ only in the order of the fp32 sums: in one product of that
size 0.008% of the outputs were one bf16 step apart (tests/core/unit/test_cpu_bf16.py compares them on
fresh inputs). A recipe that computes in bf16 is still judged in bf16: its weights, activations and
every other op keep their dtype, and the products' results are bf16 values.

`enable()` registers that computation as the CPU kernel of aten's functional products (mm, addmm, bmm,
baddbmm), process-wide: every path reaches them (nn.Linear, matmul, DTensor's local ops, autograd's
backward formulas, a traced or per-block compiled step run by aot_eager). Other dtypes go on to torch's
own kernel (the op's `out=` overload, which the registration leaves alone), at ~40 us of Python per
product (15 us against 54 for a 64x64 fp32 product here). What inductor compiles calls the `out=` overloads itself and keeps torch's kernel.
A Trainer on the CPU that computes in bf16 (training.dtype or mixed_precision_param) enables it before it
builds its model, and so does the CPU peak's bf16 probe, so a run's MFU divides by the rate its products
get. An fp32 run never pays the Python call: its process keeps torch's kernels until a bf16 run in it.
"""

from __future__ import annotations

import threading
import warnings

import torch

_lock = threading.Lock()
_library: torch.library.Library | None = None


def bf16_gemm_is_native() -> bool:
    """Whether torch's bf16 gemm has oneDNN's kernels on this CPU (its own test: bf16 instructions)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _bf16(*tensors: torch.Tensor) -> bool:
    """Every operand bf16 (mixed dtypes go on to torch's kernel, which refuses them with its own error)."""
    return all(t.dtype == torch.bfloat16 for t in tensors)


def _rounded(op, *args, **kwargs) -> torch.Tensor:
    """`op` on the bf16 operands upcast to fp32, its result rounded to bf16 once."""
    return op(*(a.float() for a in args), **kwargs).to(torch.bfloat16)


def _mm(a, b):
    if _bf16(a, b):
        return _rounded(torch.mm, a, b)
    # an empty result of the dtype the functional op would give it (mm's and addmm's: self's; bmm's: the second
    # operand's), sized by torch's kernel, which then refuses what it refuses without the registration (a
    # shape, mixed dtypes) with its own message
    return torch.ops.aten.mm.out(a, b, out=a.new_empty(0))


def _addmm(bias, a, b, *, beta=1, alpha=1):
    if _bf16(bias, a, b):
        return _rounded(torch.addmm, bias, a, b, beta=beta, alpha=alpha)
    return torch.ops.aten.addmm.out(bias, a, b, beta=beta, alpha=alpha, out=bias.new_empty(0))


def _bmm(a, b):
    if _bf16(a, b):
        return _rounded(torch.bmm, a, b)
    return torch.ops.aten.bmm.out(a, b, out=b.new_empty(0))  # bmm's result takes the second operand's dtype


def _baddbmm(bias, a, b, *, beta=1, alpha=1):
    if _bf16(bias, a, b):
        return _rounded(torch.baddbmm, bias, a, b, beta=beta, alpha=alpha)
    return torch.ops.aten.baddbmm.out(bias, a, b, beta=beta, alpha=alpha, out=b.new_empty(0))  # as bmm's


KERNELS = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm}
"""aten's functional matrix products whose CPU kernel is replaced (linear and matmul decompose to them)."""


def enabled() -> bool:
    return _library is not None


def enable() -> bool:
    """Compute this process's CPU bf16 products in fp32 (module docstring) where torch's bf16 gemm is not
    native here; idempotent. Returns whether they are."""
    global _library
    with _lock:
        if _library is None and not bf16_gemm_is_native():
            library = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
                warnings.simplefilter("ignore", UserWarning)
                for name, kernel in KERNELS.items():
                    library.impl(name, kernel, "CPU")
            _library = library
        return _library is not None


def disable() -> None:
    """torch's own CPU kernels again (the registration removed): the reference the tests compare with."""
    global _library
    with _lock:
        if _library is not None:
            _library._destroy()
            _library = None
