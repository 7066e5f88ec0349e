"""Per-call overhead of the JAX bridge against the same jitted JAX function called natively.

The function is a cheap elementwise one (so the fixed costs dominate at small sizes):
native = jitted JAX on JAX arrays + block_until_ready; bridged = the torch custom op on
torch tensors (DLPack in, the same jit, block_until_ready, DLPack out); the backward op
(a second custom op running jax.vjp) against the same vjp jitted natively. Large sizes
show whether the bridge copies: zero-copy overhead stays flat as the tensor grows. A full
autograd round trip, bridged against plain torch, is given for context (the autograd
engine's own cost is not the bridge's). Speed is reported through titan_core.measure.timing: each
pair is `compare`d interleaved in one process, one sample being a batch of `--calls` calls;
per-call figures are the comparison's medians over the batch. Prints JSON with the
protocol's settings and the machine's load.

    python bench/jax_bridge.py [--calls 400] [--sizes 16,65536,4194304] [--min-rounds N --max-rounds N]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import _report  # noqa: E402
from titan_core.kernels.jax_bridge import jax_op  # noqa: E402
from titan_core.measure.timing import compare, timed  # noqa: E402


def _scale_shift(x, y):
    return x * 2.0 + y


@jax_op("bench_scale_shift")
def scale_shift(x: jax.Array, y: jax.Array) -> jax.Array:
    return _scale_shift(x, y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=400, help="calls per timed sample (a quarter for autograd)")
    ap.add_argument("--sizes", default="16,65536,4194304", help="elements")
    _report.add_protocol_args(ap)
    opts = ap.parse_args()
    protocol = _report.protocol_from(opts)
    native_jit = jax.jit(_scale_shift)
    native_vjp = jax.jit(lambda x, y, g: jax.vjp(_scale_shift, x, y)[1](g))
    _, bridged_bwd = scale_shift.ops("dlpack")
    report = _report.start("jax_bridge", protocol, jax=jax.__version__, torch=torch.__version__, results=[])

    def batch(fn, calls):
        def run():
            for _ in range(calls):
                fn()

        return timed(run)

    for n in [int(s) for s in opts.sizes.split(",") if s]:
        xt, yt, gt = torch.randn(n), torch.randn(n), torch.ones(n)
        xj, yj, gj = (jnp.asarray(t.numpy()) for t in (xt, yt, gt))
        xg, yg = xt.clone().requires_grad_(), yt.clone().requires_grad_()
        pairs = {  # name: (candidate, baseline, calls per sample)
            "fwd": ("bridged_fwd", lambda: scale_shift(xt, yt), "native_fwd",
                    lambda: native_jit(xj, yj).block_until_ready(), opts.calls),
            "bwd": ("bridged_bwd_op", lambda: bridged_bwd(xt, yt, gt), "native_vjp",
                    lambda: jax.block_until_ready(native_vjp(xj, yj, gj)), opts.calls),
            # Context, not bridge overhead: a whole autograd round trip, bridged and pure torch.
            "autograd": ("bridged_autograd_fwd_bwd", lambda: torch.autograd.grad(scale_shift(xg, yg), (xg, yg), gt),
                         "torch_autograd_fwd_bwd", lambda: torch.autograd.grad(xg * 2.0 + yg, (xg, yg), gt),
                         max(opts.calls // 4, 1)),
        }  # fmt: skip
        row = {"elements": n}
        for what, (cand, cand_fn, base, base_fn, calls) in pairs.items():
            cmp = compare(batch(cand_fn, calls), batch(base_fn, calls), protocol)
            row[f"{cand}_us"] = cmp.candidate_median_s / calls * 1e6
            row[f"{base}_us"] = cmp.baseline_median_s / calls * 1e6
            report["comparisons"].append(_report.entry(cmp, cand, base, elements=n, calls_per_sample=calls))
        row["fwd_overhead_us"] = row["bridged_fwd_us"] - row["native_fwd_us"]
        row["bwd_overhead_us"] = row["bridged_bwd_op_us"] - row["native_vjp_us"]
        report["results"].append(row)
        _report.progress(row)
    _report.emit(report)


if __name__ == "__main__":
    main()
