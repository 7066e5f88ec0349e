"""MoE expert backends side by side: forward + backward time of the experts at a few shapes.

Backends: loop (reference, one matmul chain per expert), grouped_mm (torch._grouped_mm
over expert-sorted tokens), tokamax (ragged_dot through the JAX bridge; xla on CPU). Routing
is random top-k with one expert left empty (the dropless path must cope). Each backend is
checked against the loop (rel. L2 of the output) so a fast wrong answer shows.

    python bench/moe.py [--dtype float32|bfloat16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

from titan_core.kernels.attention import KernelUnavailable  # noqa: E402
from titan_core.kernels.moe import GroupedMMExperts, TokamaxExperts  # noqa: E402
from titan_core.models.common.moe import Experts  # noqa: E402

# (tokens, dim, hidden, experts, top_k)
SHAPES = [(1024, 256, 256, 8, 2), (4096, 512, 512, 8, 2), (4096, 512, 256, 32, 4)]


def _setup(shape, dtype):
    tokens, dim, hidden, n_exp, top_k = shape
    gen = torch.Generator().manual_seed(0)
    ref = Experts(n_exp, dim, hidden)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * dim**-0.5)
    ref = ref.to(dtype)
    x = torch.randn(tokens, dim, generator=gen).to(dtype).requires_grad_()
    scores = torch.randn(tokens, n_exp, generator=gen)
    scores[:, n_exp - 1] = float("-inf")  # one expert gets no tokens
    weights, experts = torch.topk(torch.softmax(scores, -1), top_k, dim=-1)
    return ref, x, weights.to(dtype), experts


def _time(fn, repeats):
    fn()
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
    results = []
    for shape in SHAPES:
        ref, x, weights, experts = _setup(shape, dtype)
        with torch.no_grad():
            want = ref(x, weights, experts)
        for name, module in (("loop", ref), ("grouped_mm", GroupedMMExperts(ref)), ("tokamax", TokamaxExperts(ref))):
            row = {"backend": name, "shape_tokens_dim_hidden_experts_topk": list(shape), "dtype": opts.dtype}

            def call():
                out = module(x, weights, experts)
                out.sum().backward()
                return out

            try:
                out = call()
                row["rel_l2_vs_loop"] = ((out.detach().double() - want.double()).norm() / want.double().norm()).item()
                row["time_s"] = _time(call, opts.repeats)
            except KernelUnavailable as e:
                row["unavailable"] = str(e)
            results.append(row)
            print(json.dumps(row), flush=True)
    print(
        json.dumps({"threads": torch.get_num_threads(), "measures": "forward+backward", "results": results}, indent=1)
    )


if __name__ == "__main__":
    main()
