"""bf16 on a CPU without bf16 instructions: torch's own bf16 gemm against titan_core's fp32 products
rounded once (titan_core/runtime/cpu_bf16.py), side by side in one process.

Per shape, one process, one bf16 Trainer (llama3, `training.dtype = bfloat16`, batch 1), the same batch
and weights on both paths, measures:

- numerics: the loss and every gradient of one forward + backward on each path (relative error);
- time: one forward + backward per sample, the fp32 products against torch's kernel, interleaved
  (titan_core.measure.timing.compare: ratio with its 99% interval);
- one product (PRODUCT_N x PRODUCT_N @ PRODUCT_N x 4 PRODUCT_N) the same way, the kernel alone, and each
  path's relative error from the fp64 product.

    nice python bench/cpu_bf16_matmul.py [--shapes tiny,demo] [--min-rounds N --max-rounds N] [--out FILE]

On a CPU whose bf16 gemm is native (`bf16_gemm_is_native`) there is nothing to replace: the report says
so and times nothing. Prints one JSON document on stdout; progress on stderr.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import _report  # noqa: E402

SHAPES = {
    "tiny": {"overrides": "{n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, vocab_size = 256}", "seq": 128},
    "demo": {"overrides": "{}", "seq": 512},
}
PRODUCT_N = 256


def _on(path: str) -> None:
    from titan_core.runtime import cpu_bf16

    if path == "fp32_products":
        cpu_bf16.enable()
    else:
        cpu_bf16.disable()


def run_shape(shape: str, protocol, work: str) -> dict:
    from titan_core.measure.numerics import rel, rel_l2
    from titan_core.measure.timing import compare

    spec = SHAPES[shape]
    trainer = _report.one_process_trainer(spec["overrides"], spec["seq"], f"{work}/{shape}", "--training.dtype=bfloat16")
    batch = next(trainer.data)
    model = trainer.model

    def forward_backward() -> tuple[float, dict]:
        model.zero_grad(set_to_none=True)
        loss, _ = model.loss(batch.tokens, batch.labels, **batch.loss_kwargs())
        loss.backward()
        return loss.item(), {n: p.grad for n, p in model.named_parameters()}  # set_to_none: fresh ones next

    def sample(path: str):
        def one() -> float:
            _on(path)
            start = time.perf_counter()
            forward_backward()
            return time.perf_counter() - start

        return one

    results = {}
    for path in ("torch_kernel", "fp32_products"):
        _report.progress(f"{shape}: one step with {path}")
        _on(path)
        results[path] = forward_backward()
    (loss_t, grads_t), (loss_f, grads_f) = results["torch_kernel"], results["fp32_products"]
    _report.progress(f"{shape}: timing fp32_products against torch_kernel")
    cmp = compare(sample("fp32_products"), sample("torch_kernel"), protocol)
    _on("fp32_products")
    return {
        "shape": shape, "seq": spec["seq"], "params_dtype": str(next(model.parameters()).dtype),
        "loss": {"torch_kernel": loss_t, "fp32_products": loss_f, "rel": rel(loss_f, loss_t)},
        "grad_max_rel_l2": max(rel_l2(grads_f[n], g) for n, g in grads_t.items()),
        "comparisons": [_report.entry(cmp, "fp32_products", "torch_kernel", shape=shape)],
    }  # fmt: skip


def product(n: int, protocol) -> dict:
    import torch

    from titan_core.measure.numerics import rel_l2
    from titan_core.measure.timing import compare

    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, 4 * n, dtype=torch.bfloat16)
    want = a.double() @ b.double()

    def sample(path: str):
        def one() -> float:
            _on(path)
            start = time.perf_counter()
            a @ b
            return time.perf_counter() - start

        return one

    errors = {}
    for path in ("torch_kernel", "fp32_products"):
        _on(path)
        errors[path] = rel_l2(a @ b, want)
    cmp = compare(sample("fp32_products"), sample("torch_kernel"), protocol)
    _on("fp32_products")
    entry = _report.entry(cmp, "fp32_product", "torch_kernel_product", product=f"{n}x{n} @ {n}x{4 * n}")
    return {"n": n, "rel_err_vs_fp64": errors, "comparison": entry}


def main() -> None:
    from titan_core.runtime import cpu_bf16

    if cpu_bf16.bf16_gemm_is_native():
        _report.emit({"benchmark": "cpu_bf16_matmul", "bf16_gemm_is_native": True, "comparisons": [],
                      "load_avg_1m": {"start": _report.load()}, "note": "nothing replaced on this CPU"})
        return
    report, a = _report.by_shape("cpu_bf16_matmul", __doc__, "tiny,demo", run_shape, bf16_gemm_is_native=False)
    one = product(PRODUCT_N, _report.protocol_from(a))
    report["comparisons"].append(one.pop("comparison"))
    report["product"] = one
    _report.emit(report, a.out)


if __name__ == "__main__":
    main()
