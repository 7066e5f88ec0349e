"""Published training runs beside the plan's predictions: where the time model's constants come from, and
the rows that test it without having set anything.

    rows = [predicted(row) for row in PUBLISHED]     # predicted / published, per row
    derive_constants()                               # the constants plan/step_time.py holds, recomputed

Each row is a run someone published, re-created here on meta (the family's flavor of the model, its
target from hardware.py, the published layout, batch, memory policy and execution mode). Every row
compares tokens/s per device, which no FLOP-counting convention changes (MaxText's TFLOP/s halve causal
attention and count the LM head; TorchTitan's MFU counts 6N plus unhalved attention: neither is used).
Five rows set one constant each (`calibrates`); the rest are held out: they set nothing and test the
model on what it was not fitted to (other chip counts, 405B, experts, float8 on a TPU, TP over 256 GPUs).

- TorchTitan, docs/performance.md, Table 1 (pytorch/torchtitan): "Llama 3.1 8B, 8 H100s (96 GB HBM2e,
  500 W), FSDP 8, local batch 2, selective activation checkpointing": 5,762 tokens/s per GPU eager,
  6,667 with torch.compile, 8,532 with torch.compile and Float8; Table 3, the same on 128 H100s: 5,605,
  6,514, 8,380. Sequence not stated in the tables; the configs at that commit train at 8192.
- TorchTitan, benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: "Llama3 70b on 256 H100s with
  FSDP=32, TP=8, torch.compile, full AC, local batch size 16": 597.3 tokens/s per GPU in bfloat16 with
  vanilla TP (652.4 with async TP, which titan_core does not have).
- TorchTitan PR #1881 (SimpleFSDP, merged as d9bdfbb): "FSDP2 under eager mode, SimpleFSDP uses aot_eager
  backend ... All Batch_size = 1", Llama 3 8B on 8 H100, FSDP 8: SimpleFSDP 7,227, FSDP2-eager 7,380
  tokens/s: a whole-graph step run as traced against eager, the pair fits GRAPH_AS_IS_RATIO.
- MaxText on Ironwood, AI-Hypercomputer/tpu-recipes training/ironwood/README.md (tokens/sec/chip; every
  recipe FSDP over all chips, jit with scan_layers, remat "custom" recomputing the MLP or everything but
  a few projections: priced as `full`; per_device_batch_size counts each chip's 2 devices):
  llama3.1-70b on 64 chips, seq 8192, GBS 256: 2,686.98 (bf16), 4,127.56 (fp8_full); on 256 chips, GBS
  1024: 2,670.55; llama3.1-405b on 256 chips, seq 8192, GBS 1536: 499.77; qwen3-235b-a22b on 256
  chips, seq 4096, GBS 8192, experts sharded on the FSDP axis (no EP): 4,245.89.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from titan_core.memory.budget import GIB
from titan_core.memory.estimate import ModelShape, TrainSetup
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import flops_per_token
from titan_core.models.registry import build_meta, get_family
from titan_core.parallel.plans import TP_PLANS

from onboard.sizing.plan.planner import CAPTURED_MOE, parse_target, predict_layout
from onboard.sizing.plan.layout_memory import Layout
from onboard.sizing.plan.step_time import (
    COMPUTE_EFFICIENCY,
    EAGER_RATIO,
    FLOAT8_REALISED,
    GRAPH_AS_IS_RATIO,
    Efficiency,
    efficiency_for,
)

TORCHTITAN = ("TorchTitan docs/performance.md, Table 1: Llama 3.1 8B on 8 x H100 (96 GB HBM2e, 500 W), FSDP 8, "
              "local batch 2, seq 8192, selective activation checkpointing")  # fmt: skip
TORCHTITAN_128 = "TorchTitan docs/performance.md, Table 3: the same on 128 x H100, FSDP 128"
ASYNC_TP = ("TorchTitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md: Llama3 70b on 256 H100s, FSDP=32, "
            "TP=8, torch.compile, full AC, local batch size 16, bfloat16, vanilla TP")  # fmt: skip
SIMPLEFSDP = ("TorchTitan PR #1881 (SimpleFSDP, commit d9bdfbb): Llama 3 8B on 8 x H100, FSDP 8, batch 1; "
              "SimpleFSDP with the aot_eager backend against FSDP2 eager")  # fmt: skip
MAXTEXT = ("MaxText on Ironwood, AI-Hypercomputer/tpu-recipes training/ironwood/README.md (tokens/sec/chip), "
           "FSDP over every chip, jit with scan_layers, custom remat (priced as full)")  # fmt: skip


@dataclass(frozen=True)
class Published:
    id: str
    family: str
    flavor: str
    target: str
    seq_len: int
    source: str
    tokens_per_s_device: float
    layout: Layout
    batch: int = 1
    """Sequences per microbatch per data-parallel rank (per chip for MaxText: 2 x per_device_batch_size)."""
    policy: str = "none"
    data_parallel: str | None = None
    mode: str = "compile"
    """eager | compile | graph_trainer | scan: how the run executed its step."""
    compiled: bool = True
    """A captured step is compiled (inductor, or XLA on a TPU), not run as traced."""
    float8: bool = False
    memory_gib: int | None = None
    """The run's device memory where it differs from the table's (TorchTitan's 96 GB H100s)."""
    calibrates: str | None = None
    """The constant this row sets (None: held out)."""
    relative_to: str | None = None
    """The row it is a pair with (the same software, batch and cluster): its ratio is of the two ratios."""


PUBLISHED = (
    Published("torchtitan-llama3.1-8b-eager", "llama3", "8B", "h100:8", 8192, TORCHTITAN + "; FSDP, eager", 5762,
              Layout(8), batch=2, policy="default", data_parallel="fsdp2", mode="eager", memory_gib=96,
              calibrates="EAGER_RATIO"),
    Published("torchtitan-llama3.1-8b-compile", "llama3", "8B", "h100:8", 8192, TORCHTITAN + "; FSDP + torch.compile",
              6667, Layout(8), batch=2, policy="default", data_parallel="fsdp2", memory_gib=96,
              calibrates="COMPUTE_EFFICIENCY['cuda']"),
    Published("torchtitan-llama3.1-8b-float8", "llama3", "8B", "h100:8", 8192,
              TORCHTITAN + "; FSDP + torch.compile + Float8", 8532, Layout(8), batch=2, policy="default",
              data_parallel="fsdp2", float8=True, memory_gib=96, calibrates="FLOAT8_REALISED"),
    Published("torchtitan-fsdp2-eager-batch1", "llama3", "8B", "h100:8", 8192, SIMPLEFSDP + "; FSDP2 eager", 7380,
              Layout(8), batch=1, policy="default", data_parallel="fsdp2", mode="eager", memory_gib=96),
    Published("torchtitan-simplefsdp-aot-eager", "llama3", "8B", "h100:8", 8192, SIMPLEFSDP + "; SimpleFSDP aot_eager",
              7227, Layout(8), batch=1, policy="default", data_parallel="simple_fsdp", mode="graph_trainer",
              compiled=False, memory_gib=96, calibrates="GRAPH_AS_IS_RATIO",
              relative_to="torchtitan-fsdp2-eager-batch1"),
    Published("maxtext-llama3.1-70b-v7x64", "llama3", "70B", "v7x:64", 8192, MAXTEXT + "; llama3.1-70b, 64 chips, "
              "GBS 256, bf16", 2686.98, Layout(64), batch=4, policy="full", data_parallel="simple_fsdp", mode="scan",
              calibrates="COMPUTE_EFFICIENCY['tpu']"),
    # held out
    Published("maxtext-llama3.1-70b-v7x256", "llama3", "70B", "v7x:256", 8192, MAXTEXT + "; llama3.1-70b, 256 chips, "
              "GBS 1024, bf16", 2670.55, Layout(256), batch=4, policy="full", data_parallel="simple_fsdp",
              mode="scan"),
    Published("maxtext-llama3.1-70b-v7x64-fp8", "llama3", "70B", "v7x:64", 8192, MAXTEXT + "; llama3.1-70b, 64 chips, "
              "GBS 256, fp8_full", 4127.56, Layout(64), batch=4, policy="full", data_parallel="simple_fsdp",
              mode="scan", float8=True),
    Published("maxtext-llama3.1-405b-v7x256", "llama3", "405B", "v7x:256", 8192, MAXTEXT + "; llama3.1-405b, 256 "
              "chips, GBS 1536, bf16", 499.77, Layout(256), batch=6, policy="full", data_parallel="simple_fsdp",
              mode="scan"),
    Published("maxtext-qwen3-235b-a22b-v7x256", "qwen3_moe", "235B-A22B", "v7x:256", 4096, MAXTEXT + "; "
              "qwen3-235b-a22b, 256 chips, GBS 8192, bf16, experts sharded on the FSDP axis", 4245.89, Layout(256),
              batch=32, policy="full", data_parallel="simple_fsdp", mode="scan"),
    Published("torchtitan-llama3.1-70b-h100x256", "llama3", "70B", "h100:256", 8192, ASYNC_TP, 597.3,
              Layout(32, tp=8), batch=16, policy="full", data_parallel="fsdp2", memory_gib=96),
    Published("torchtitan-llama3.1-8b-h100x128-compile", "llama3", "8B", "h100:128", 8192,
              TORCHTITAN_128 + "; torch.compile", 6514, Layout(128), batch=2, policy="default", data_parallel="fsdp2",
              memory_gib=96),
    Published("torchtitan-llama3.1-8b-h100x128-eager", "llama3", "8B", "h100:128", 8192, TORCHTITAN_128 + "; eager",
              5605, Layout(128), batch=2, policy="default", data_parallel="fsdp2", mode="eager", memory_gib=96),
)  # fmt: skip


def _model(family: str, flavor: str):
    args = get_family(family).flavors[flavor]
    meta = build_meta(family, args)
    shape = ModelShape.from_model(meta, args)
    return args, shape, count_params(meta)


_MODELS: dict[tuple[str, str], Any] = {}


def _option(row: Published, eff: Efficiency):
    key = (row.family, row.flavor)
    if key not in _MODELS:
        _MODELS[key] = _model(*key)
    args, ps, counts = _MODELS[key]
    target = parse_target(row.target)
    if row.memory_gib:
        target = replace(target, memory_bytes=row.memory_gib * GIB, memory_source=f"{row.memory_gib} GB (the run's)")
    kernels = TrainSetup(batch_size=1, seq_len=1, loss="fused_ce", moe=CAPTURED_MOE[target.device_type])
    fpt = lambda s: flops_per_token(args, s)  # noqa: E731
    return predict_layout(ps, counts, fpt, target, row.layout, seq_len=row.seq_len, kernels=kernels, batch=row.batch,
                          policy=row.policy, data_parallel=row.data_parallel, mode=row.mode, compiled=row.compiled,
                          float8=row.float8, eff=eff)  # fmt: skip


BY_ID = {row.id: row for row in PUBLISHED}


def predicted(row: Published, eff: Efficiency | None = None) -> dict[str, Any]:
    """The plan's prediction for `row` beside its published figure (JSON-ready); a row of a pair is judged by
    the ratio of its figure to its partner's."""
    device = parse_target(row.target).device_type
    eff = eff or efficiency_for(device)
    opt = _option(row, eff)
    step = opt.step
    out: dict[str, Any] = {
        "id": row.id, "model": f"{row.family} {row.flavor}", "target": row.target, "seq_len": row.seq_len,
        "layout": opt.layout.name, "policy": opt.policy, "mode": opt.mode, "batch": opt.batch,
        "fits_memory_model": opt.largest_batch >= max(1, opt.batch), "float8": row.float8, "source": row.source,
        "calibrates": row.calibrates, "held_out": row.calibrates is None and not _is_reference(row),
        "predicted_tokens_per_s_device": step.tokens_per_s_device, "predicted_mfu": step.mfu,
        "published_tokens_per_s_device": row.tokens_per_s_device,
        "ratio": step.tokens_per_s_device / row.tokens_per_s_device, "ratio_of": "tokens/s/device",
    }  # fmt: skip
    if row.relative_to:
        partner = BY_ID[row.relative_to]
        other = _option(partner, eff).step.tokens_per_s_device
        out["ratio"] = (step.tokens_per_s_device / other) / (row.tokens_per_s_device / partner.tokens_per_s_device)
        out["ratio_of"] = f"tokens/s/device over {partner.id}'s"
    return out


def _is_reference(row: Published) -> bool:
    """The partner of a pair: its own figure is another software version's, not a test of the model."""
    return any(r.relative_to == row.id for r in PUBLISHED)


def derive_constants(rounds: int = 3) -> dict[str, float]:
    """The constants plan/step_time.py holds, recomputed from PUBLISHED: each calibrating row's constant scaled
    until its prediction meets its figure (float8's by bisection: its effect is not proportional)."""
    eff = Efficiency(COMPUTE_EFFICIENCY["cuda"], EAGER_RATIO, FLOAT8_REALISED, GRAPH_AS_IS_RATIO)
    tpu = COMPUTE_EFFICIENCY["tpu"]
    rows = {r.calibrates: r for r in PUBLISHED if r.calibrates}
    for _ in range(rounds):
        r = predicted(rows["COMPUTE_EFFICIENCY['cuda']"], eff)
        eff = replace(eff, compute=eff.compute / r["ratio"])
        r = predicted(rows["EAGER_RATIO"], eff)
        eff = replace(eff, eager_ratio=eff.eager_ratio / r["ratio"])
        r = predicted(rows["GRAPH_AS_IS_RATIO"], eff)
        eff = replace(eff, graph_as_is_ratio=eff.graph_as_is_ratio / r["ratio"])
        r = predicted(rows["COMPUTE_EFFICIENCY['tpu']"], replace(eff, compute=tpu))
        tpu = tpu / r["ratio"]
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if predicted(rows["FLOAT8_REALISED"], replace(eff, float8_realised=mid))["ratio"] < 1:
            lo = mid
        else:
            hi = mid
    return {"COMPUTE_EFFICIENCY['cuda']": eff.compute, "COMPUTE_EFFICIENCY['tpu']": tpu,
            "EAGER_RATIO": eff.eager_ratio, "FLOAT8_REALISED": (lo + hi) / 2,
            "GRAPH_AS_IS_RATIO": eff.graph_as_is_ratio}  # fmt: skip


def constants_in_use() -> dict[str, float]:
    return {"COMPUTE_EFFICIENCY['cuda']": COMPUTE_EFFICIENCY["cuda"], "COMPUTE_EFFICIENCY['tpu']":
            COMPUTE_EFFICIENCY["tpu"], "EAGER_RATIO": EAGER_RATIO, "FLOAT8_REALISED": FLOAT8_REALISED,
            "GRAPH_AS_IS_RATIO": GRAPH_AS_IS_RATIO}  # fmt: skip
