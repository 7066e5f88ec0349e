"""Attention backends side by side: forward + backward time per call at a few shapes.

Backends: naive (reference), sdpa, tokamax (JAX bridge; xla on CPU), flex (forward only
on CPU: no backward there), splash (TPU only; on CPU reported as unavailable with the
reason). Masks: plain causal, and sliding window + packed documents. Speed is reported
through titan_core.measure.timing: each backend is `compare`d against naive, interleaved in one
process (each sample one call, doing what the backend's call does: forward + backward, or
forward only for flex on CPU), giving the time ratio with its interval. Each case also
checks the backend against naive (rel. L2 of the output), so a fast wrong answer shows.
Prints JSON with the protocol's settings and the machine's load.

    python bench/attention.py [--dtype float32] [--shapes small,medium,large] [--backends sdpa,tokamax,...]
                              [--min-rounds N --max-rounds N]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

import _report  # noqa: E402
from titan_core.config.dtypes import DTYPES  # noqa: E402
from titan_core.kernels.attention import FlexAttention, KernelUnavailable, SplashAttention, TokamaxAttention  # noqa: E402
from titan_core.models.common.attention import NaiveAttention, SDPAttention  # noqa: E402
from titan_core.measure.timing import compare, timed  # noqa: E402

# (batch, heads, kv_heads, seq, head_dim); tiny: a smoke test
SHAPES = {
    "tiny": (1, 4, 2, 64, 32),
    "small": (1, 8, 2, 256, 64),
    "medium": (1, 16, 4, 1024, 64),
    "large": (2, 8, 8, 2048, 64),
}
MASKS = {"causal": (None, False), "window512_packed": (512, True)}
BACKENDS = {"sdpa": SDPAttention, "tokamax": TokamaxAttention, "flex": FlexAttention, "splash": SplashAttention}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--shapes", default="small,medium,large", help=f"of {', '.join(SHAPES)} (tiny: a smoke test)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="compared against naive")
    ap.add_argument("--masks", default=",".join(MASKS))
    _report.add_protocol_args(ap)
    opts = ap.parse_args()
    protocol = _report.protocol_from(opts)
    dtype = DTYPES[opts.dtype]
    naive = NaiveAttention()
    backends = {name: BACKENDS[name]() for name in opts.backends.split(",") if name}
    report = _report.start("attention", protocol, dtype=opts.dtype, threads=torch.get_num_threads(), results=[])
    for shape_name in opts.shapes.split(","):
        shape = SHAPES[shape_name]
        for mask_name in opts.masks.split(","):
            window, packed = MASKS[mask_name]
            q, k, v, seg = _inputs(shape, dtype, packed)
            with torch.no_grad():
                ref = naive(q, k, v, scale=0.125, window=window, segment_ids=seg)
            for name, core in backends.items():
                case = {"shape": shape_name, "shape_bnksd": list(shape), "mask": mask_name}
                row = {"backend": name, **case, "dtype": opts.dtype}
                train = not (name == "flex" and q.device.type == "cpu")

                def call(core=core):
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
                    cmp = compare(timed(call), timed(lambda: call(naive)), protocol)
                    row["time_s"], row["naive_time_s"] = cmp.candidate_median_s, cmp.baseline_median_s
                    row["measures"] = "forward+backward" if train else "forward only (no CPU backward), naive alike"
                    report["comparisons"].append(_report.entry(cmp, name, "naive", **case))
                except KernelUnavailable as e:
                    row["unavailable"] = str(e)
                report["results"].append(row)
                _report.progress(row)
    _report.emit(report)


if __name__ == "__main__":
    main()
