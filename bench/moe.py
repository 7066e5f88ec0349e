"""MoE expert backends side by side: forward + backward time of the experts at a few shapes.

Backends: loop (reference, one matmul chain per expert), grouped_mm (torch._grouped_mm
over expert-sorted tokens), tokamax (ragged_dot through the JAX bridge; xla on CPU). Routing
is random top-k with one expert left empty (the dropless path must cope). Speed is reported
through titan_core.measure.timing: each backend is `compare`d against the loop, interleaved in one
process (each sample one forward + backward), giving the time ratio with its interval.
Each backend is checked against the loop (rel. L2 of the output) so a fast wrong answer
shows. Prints JSON with the protocol's settings and the machine's load.

    python bench/moe.py [--dtype float32|bfloat16] [--shapes small,medium,many_experts]
                        [--backends grouped_mm,tokamax] [--min-rounds N --max-rounds N]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

import _report  # noqa: E402
from titan_core.config.dtypes import DTYPES  # noqa: E402
from titan_core.kernels.attention import KernelUnavailable  # noqa: E402
from titan_core.kernels.moe import GroupedMMExperts, TokamaxExperts  # noqa: E402
from titan_core.models.common.moe import Experts  # noqa: E402
from titan_core.measure.timing import compare, timed  # noqa: E402

# (tokens, dim, hidden, experts, top_k); tiny: a smoke test
SHAPES = {
    "tiny": (128, 32, 32, 4, 2),
    "small": (1024, 256, 256, 8, 2),
    "medium": (4096, 512, 512, 8, 2),
    "many_experts": (4096, 512, 256, 32, 4),
}
BACKENDS = {"grouped_mm": GroupedMMExperts, "tokamax": TokamaxExperts}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--shapes", default="small,medium,many_experts", help=f"of {', '.join(SHAPES)} (tiny: smoke)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="compared against loop")
    _report.add_protocol_args(ap)
    opts = ap.parse_args()
    protocol = _report.protocol_from(opts)
    dtype = DTYPES[opts.dtype]
    report = _report.start(
        "moe", protocol, dtype=opts.dtype, threads=torch.get_num_threads(), measures="forward+backward", results=[]
    )
    for shape_name in opts.shapes.split(","):
        shape = SHAPES[shape_name]
        ref, x, weights, experts = _setup(shape, dtype)
        with torch.no_grad():
            want = ref(x, weights, experts)

        def call(module):
            out = module(x, weights, experts)
            out.sum().backward()
            return out

        for name in [b for b in opts.backends.split(",") if b]:
            case = {"shape": shape_name, "shape_tokens_dim_hidden_experts_topk": list(shape)}
            row = {"backend": name, **case, "dtype": opts.dtype}
            try:
                module = BACKENDS[name](ref)
                out = call(module)
                row["rel_l2_vs_loop"] = ((out.detach().double() - want.double()).norm() / want.double().norm()).item()
                cmp = compare(timed(lambda: call(module)), timed(lambda: call(ref)), protocol)
                row["time_s"], row["loop_time_s"] = cmp.candidate_median_s, cmp.baseline_median_s
                report["comparisons"].append(_report.entry(cmp, name, "loop", **case))
            except KernelUnavailable as e:
                row["unavailable"] = str(e)
            report["results"].append(row)
            _report.progress(row)
    _report.emit(report)


if __name__ == "__main__":
    main()
