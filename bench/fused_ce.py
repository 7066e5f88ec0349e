"""Fused linear cross-entropy vs the plain (naive) head: peak memory and time, fwd + bwd.

Default shape: 4096 tokens, hidden 1024, vocab 128256, fp32 on CPU. Each variant runs in
its own subprocess so one cannot inherit the other's allocator state or peak. The memory
figure is what the loss itself adds on top of what both variants must hold (hidden states,
weight, and at the end of the step their gradients): the process's peak resident set during
one forward + backward, minus its resident set just before (gradients set to None), minus
the bytes of the two gradients the step creates. Linux VmHWM is reset through
/proc/self/clear_refs so each step is measured on its own. Prints JSON with both ratios.

    python bench/fused_ce.py [--tokens 4096 --hidden 1024 --vocab 128256 --chunk 1024 --iters 2 --rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

MEMORY_TARGET = 0.15  # fused peak at most 15% of naive's
TIME_TARGET = 1.3  # fused time at most 1.3x naive's


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def run_variant(opts) -> dict:
    import torch

    from titan_core.kernels.fused_ce import fused_linear_cross_entropy, reference_cross_entropy

    dtype = getattr(torch, opts.dtype)
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(opts.tokens, opts.hidden, generator=gen, dtype=dtype).requires_grad_()
    w = (torch.randn(opts.vocab, opts.hidden, generator=gen) * opts.hidden**-0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, opts.vocab, (opts.tokens,), generator=gen)
    # Both variants end the step holding h.grad and w.grad: they are not the loss's overhead.
    grad_bytes = h.numel() * h.element_size() + w.numel() * w.element_size()

    if opts.variant == "fused":
        loss_fn = lambda: fused_linear_cross_entropy(h, w, labels, chunk=opts.chunk)  # noqa: E731
    else:
        loss_fn = lambda: reference_cross_entropy(h, w, labels)  # noqa: E731

    def step() -> float:
        loss = loss_fn()
        loss.backward()
        return loss.item()

    peaks, times, losses = [], [], []
    for _ in range(opts.iters + 1):
        h.grad = w.grad = None
        before = _status_kib("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
        peaks.append((_status_kib("VmHWM") - before) * 1024 - grad_bytes)
    # The first step also pays one-time costs (thread pool, first-touch of the allocator):
    # it is reported but not timed; memory is the largest over all steps, to be conservative.
    return {
        "variant": opts.variant,
        "loss": losses[-1],
        "peak_loss_memory_bytes": max(peaks),
        "step_times_s": times[1:],
        "first_step_time_s": times[0],
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--iters", type=int, default=2, help="timed steps after the first")
    ap.add_argument("--rounds", type=int, default=2, help="subprocess pairs, alternating order")
    ap.add_argument("--variant", choices=["naive", "fused"], help="internal: run one variant in this process")
    opts = ap.parse_args()
    if opts.variant:
        print(json.dumps(run_variant(opts)))
        return

    # Rounds alternate the order (naive, fused, fused, naive, ...) so machine noise from
    # other work hits both alike; the time is the fastest step seen, since contention only
    # ever adds time. Memory is the largest peak seen.
    runs: dict[str, list[dict]] = {"naive": [], "fused": []}
    for r in range(opts.rounds):
        for variant in ("naive", "fused") if r % 2 == 0 else ("fused", "naive"):
            cmd = [sys.executable, __file__, "--variant", variant] + [
                f"--{k}={getattr(opts, k)}" for k in ("tokens", "hidden", "vocab", "chunk", "dtype", "iters")
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[variant].append(json.loads(out.strip().splitlines()[-1]))
    results = {}
    for variant, rs in runs.items():
        peak = max(r["peak_loss_memory_bytes"] for r in rs)
        results[variant] = {
            "loss": rs[-1]["loss"],
            "peak_loss_memory_bytes": peak,
            "peak_loss_memory_gib": round(peak / 2**30, 3),
            "time_s": min(t for r in rs for t in r["step_times_s"]),
            "all_step_times_s": [round(t, 3) for r in rs for t in r["step_times_s"]],
            "threads": rs[-1]["threads"],
        }
    naive, fused = results["naive"], results["fused"]
    mem_ratio = fused["peak_loss_memory_bytes"] / naive["peak_loss_memory_bytes"]
    time_ratio = fused["time_s"] / naive["time_s"]
    report = {
        "shape": {k: getattr(opts, k) for k in ("tokens", "hidden", "vocab", "chunk", "dtype")},
        "naive": naive,
        "fused": fused,
        "loss_abs_diff": abs(fused["loss"] - naive["loss"]),
        "fused_over_naive_peak_memory_ratio": round(mem_ratio, 4),
        "fused_over_naive_time_ratio": round(time_ratio, 4),
        "memory_target_ratio_max": MEMORY_TARGET,
        "time_target_ratio_max": TIME_TARGET,
        "meets_memory_target": mem_ratio <= MEMORY_TARGET,
        "meets_time_target": time_ratio <= TIME_TARGET,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
