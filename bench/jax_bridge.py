"""Per-call overhead of the JAX bridge against the same jitted JAX function called natively.

The function is a cheap elementwise one (so the fixed costs dominate at small sizes):
native = jitted JAX on JAX arrays + block_until_ready; bridged = the torch custom op on
torch tensors (DLPack in, the same jit, block_until_ready, DLPack out); the backward op
(a second custom op running jax.vjp) against the same vjp jitted natively. Large sizes
show whether the bridge copies: zero-copy overhead stays flat as the tensor grows. A full
autograd round trip, bridged and in plain torch, is printed for context (the autograd
engine's own cost is not the bridge's).

    python bench/jax_bridge.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

from titan_core.kernels.jax_bridge import jax_op  # noqa: E402


def _scale_shift(x, y):
    return x * 2.0 + y


@jax_op("bench_scale_shift")
def scale_shift(x: jax.Array, y: jax.Array) -> jax.Array:
    return _scale_shift(x, y)


def _per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    # Median of 5 batches: robust to the odd scheduler hiccup on a shared machine.
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        batches.append((time.perf_counter() - t0) / (calls // 5) * 1e6)
    return statistics.median(batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    opts = ap.parse_args()
    native_jit = jax.jit(_scale_shift)
    native_vjp = jax.jit(lambda x, y, g: jax.vjp(_scale_shift, x, y)[1](g))
    _, bridged_bwd = scale_shift.ops("dlpack")
    results = []
    for n in (16, 65_536, 4_194_304):
        xt, yt, gt = torch.randn(n), torch.randn(n), torch.ones(n)
        xj, yj, gj = (jnp.asarray(t.numpy()) for t in (xt, yt, gt))
        xg, yg = xt.clone().requires_grad_(), yt.clone().requires_grad_()
        row = {
            "elements": n,
            "native_fwd_us": _per_call_us(lambda: native_jit(xj, yj).block_until_ready(), opts.calls),
            "bridged_fwd_us": _per_call_us(lambda: scale_shift(xt, yt), opts.calls),
            "native_vjp_us": _per_call_us(lambda: jax.block_until_ready(native_vjp(xj, yj, gj)), opts.calls),
            "bridged_bwd_op_us": _per_call_us(lambda: bridged_bwd(xt, yt, gt), opts.calls),
            # Context, not bridge overhead: a whole autograd round trip, bridged and pure torch.
            "bridged_autograd_fwd_bwd_us": _per_call_us(
                lambda: torch.autograd.grad(scale_shift(xg, yg), (xg, yg), gt), opts.calls // 4
            ),
            "torch_autograd_fwd_bwd_us": _per_call_us(
                lambda: torch.autograd.grad(xg * 2.0 + yg, (xg, yg), gt), opts.calls // 4
            ),
        }
        row["fwd_overhead_us"] = row["bridged_fwd_us"] - row["native_fwd_us"]
        row["bwd_overhead_us"] = row["bridged_bwd_op_us"] - row["native_vjp_us"]
        results.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"jax": jax.__version__, "torch": torch.__version__, "results": results}, indent=1))


if __name__ == "__main__":
    main()
