"""Attention backends side by side: forward + backward time per call at a few shapes.

Backends: naive (reference), sdpa, tokamax (JAX bridge; xla on CPU), flex (forward only
on CPU: no backward there), splash (TPU only; on CPU reported as unavailable with the
reason). Masks: plain causal, and sliding window + packed documents. Each case also
checks the backend against naive (rel. L2 of the output), so a fast wrong answer shows.

    python bench/attention.py [--dtype float32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

from titan_core.kernels.attention import FlexAttention, KernelUnavailable, SplashAttention, TokamaxAttention  # noqa: E402
from titan_core.models.common.attention import NaiveAttention, SDPAttention  # noqa: E402

# (batch, heads, kv_heads, seq, head_dim)
SHAPES = [(1, 8, 2, 256, 64), (1, 16, 4, 1024, 64), (2, 8, 8, 2048, 64)]
MASKS = {"causal": (None, False), "window512_packed": (512, True)}


def _inputs(shape, dtype, packed):
    b, n, k, s, d = shape
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, n, s, d, generator=gen).to(dtype).requires_grad_()
    kk = torch.randn(b, k, s, d, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(b, k, s, d, generator=gen).to(dtype).requires_grad_()
    seg = (
        (torch.arange(s)[None, :] >= s // 3).long().expand(b, s) + (torch.arange(s)[None, :] >= s // 2).long()
        if packed
        else None
    )
    return q, kk, v, seg


def _time(fn, repeats):
    fn()  # warm-up: JAX jit / flex block mask / allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=5)
    opts = ap.parse_args()
    dtype = getattr(torch, opts.dtype)
    backends = {
        "naive": NaiveAttention(),
        "sdpa": SDPAttention(),
        "tokamax": TokamaxAttention(),
        "flex": FlexAttention(),
        "splash": SplashAttention(),
    }
    results = []
    for shape in SHAPES:
        for mask_name, (window, packed) in MASKS.items():
            q, k, v, seg = _inputs(shape, dtype, packed)
            with torch.no_grad():
                ref = NaiveAttention()(q, k, v, scale=0.125, window=window, segment_ids=seg)
            for name, core in backends.items():
                row = {"backend": name, "shape_bnksd": list(shape), "mask": mask_name, "dtype": opts.dtype}
                train = not (name == "flex" and q.device.type == "cpu")

                def call():
                    with torch.set_grad_enabled(train):
                        out = core(q, k, v, scale=0.125, window=window, segment_ids=seg)
                        if train:
                            out.sum().backward()
                    return out

                try:
                    out = call()
                    row["rel_l2_vs_naive"] = (
                        (out.detach().double() - ref.double()).norm() / ref.double().norm()
                    ).item()
                    row["time_s"] = _time(call, opts.repeats)
                    row["measures"] = "forward+backward" if train else "forward only (no CPU backward)"
                except KernelUnavailable as e:
                    row["unavailable"] = str(e)
                results.append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps({"threads": torch.get_num_threads(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
