"""Fused linear cross-entropy vs the plain (naive) head: peak memory and time, fwd + bwd.

Default shape: 4096 tokens, hidden 1024, vocab 128256, fp32 on CPU. Memory: each variant
runs in its own subprocess so one cannot inherit the other's allocator state or peak. The
memory figure is what the loss itself adds on top of what both variants must hold (hidden
states, weight, and at the end of the step their gradients): the process's peak resident
set during one forward + backward, minus its resident set just before (gradients set to
None), minus the bytes of the two gradients the step creates. Linux VmHWM is reset through
/proc/self/clear_refs so each step is measured on its own. Time is reported through
titan_core.measure.timing: one more process holds both variants and `compare(fused, naive)` steps
them interleaved until the ratio's interval is narrow enough. Prints JSON with the memory
ratio, the comparison (interval, describe() line), the protocol's settings and the load.

    python bench/fused_ce.py [--tokens 4096 --hidden 1024 --vocab 128256 --chunk 1024 --iters 2]
                             [--min-rounds N --max-rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import _report  # noqa: E402
from titan_core.memory.estimate import format_bytes  # noqa: E402

MEMORY_TARGET = 0.15  # fused peak at most 15% of naive's
TIME_TARGET = 1.3  # fused time at most 1.3x naive's (the whole interval: ci_high)
SHAPE_KEYS = ("tokens", "hidden", "vocab", "chunk", "dtype")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _setup(opts):
    """(h, w, grad bytes, {variant: one forward + backward returning the loss})."""
    import torch

    from titan_core.config.dtypes import DTYPES
    from titan_core.kernels.fused_ce import fused_linear_cross_entropy, reference_cross_entropy

    dtype = DTYPES[opts.dtype]
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(opts.tokens, opts.hidden, generator=gen, dtype=dtype).requires_grad_()
    w = (torch.randn(opts.vocab, opts.hidden, generator=gen) * opts.hidden**-0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, opts.vocab, (opts.tokens,), generator=gen)
    # Both variants end the step holding h.grad and w.grad: they are not the loss's overhead.
    grad_bytes = h.numel() * h.element_size() + w.numel() * w.element_size()
    losses = {
        "fused": lambda: fused_linear_cross_entropy(h, w, labels, chunk=opts.chunk),
        "naive": lambda: reference_cross_entropy(h, w, labels),
    }

    def step(variant):
        def run() -> float:
            h.grad = w.grad = None
            loss = losses[variant]()
            loss.backward()
            return loss.item()

        return run

    return h, w, grad_bytes, {v: step(v) for v in losses}


def run_memory(opts) -> dict:
    """One variant's peak loss memory over `iters + 1` steps (the largest: conservative)."""
    import torch

    h, w, grad_bytes, steps = _setup(opts)
    peaks, losses = [], []
    for _ in range(opts.iters + 1):
        h.grad = w.grad = None
        before = _status_kib("VmRSS")
        _reset_peak()
        losses.append(steps[opts.variant]())
        peaks.append((_status_kib("VmHWM") - before) * 1024 - grad_bytes)
    return {
        "variant": opts.variant,
        "loss": losses[-1],
        "peak_loss_memory_bytes": max(peaks),
        "threads": torch.get_num_threads(),
    }


def run_timing(opts) -> dict:
    from titan_core.measure.timing import compare, timed

    _, _, _, steps = _setup(opts)
    cmp = compare(timed(steps["fused"]), timed(steps["naive"]), _report.protocol_from(opts))
    return _report.entry(cmp, "fused_ce", "naive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--iters", type=int, default=2, help="memory-measured steps after the first")
    ap.add_argument("--variant", choices=["naive", "fused", "timing"], help="internal: one job in this process")
    _report.add_protocol_args(ap)
    opts = ap.parse_args()
    if opts.variant:
        print(json.dumps(run_timing(opts) if opts.variant == "timing" else run_memory(opts)))
        return

    protocol = _report.protocol_from(opts)
    report = _report.start("fused_ce", protocol, shape={k: getattr(opts, k) for k in SHAPE_KEYS})

    def job(variant: str) -> dict:
        cmd = [sys.executable, __file__, f"--variant={variant}", *_report.protocol_args(protocol)]
        cmd += [f"--{k}={getattr(opts, k)}" for k in (*SHAPE_KEYS, "iters")]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    for variant in ("naive", "fused"):
        r = job(variant)
        report[variant] = {**r, "peak_loss_memory": format_bytes(r["peak_loss_memory_bytes"])}
        _report.progress(report[variant])
    cmp = job("timing")
    report["comparisons"].append(cmp)
    naive, fused = report["naive"], report["fused"]
    naive["time_s"], fused["time_s"] = cmp["baseline_median_s"], cmp["candidate_median_s"]
    mem_ratio = fused["peak_loss_memory_bytes"] / naive["peak_loss_memory_bytes"]
    report.update(
        loss_abs_diff=abs(fused["loss"] - naive["loss"]),
        fused_over_naive_peak_memory_ratio=round(mem_ratio, 4),
        memory_target_ratio_max=MEMORY_TARGET,
        time_target_ratio_max=TIME_TARGET,
        meets_memory_target=mem_ratio <= MEMORY_TARGET,
        # a comparison that was not measured (disturbed machine, no finite interval) meets nothing: unknown
        meets_time_target=None if cmp["outcome"] == "not measured" else cmp["ci_high"] <= TIME_TARGET,
    )
    _report.emit(report)


if __name__ == "__main__":
    main()
