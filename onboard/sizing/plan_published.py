"""Published training runs beside the plan's predictions: where the time model's constants come from.

    rows = [predicted(row) for row in PUBLISHED]     # predicted / published, per row
    derive_constants()                               # the constants plan_time.py holds, recomputed

Each row is a run someone published, re-created here on meta (the family's flavor of the model,
its target from hardware.py, the published layout and batch where they are given, else the plan's
own choice). Four rows set one constant each (`calibrates`); the last is held out: Qwen3-235B-A22B
tests the parts no constant was fitted to (expert parallelism, the all-to-all, the experts'
roofline, the choice of degrees).

- TorchTitan, docs/performance.md (Table 1): Llama 3.1 8B, 8 x H100 (96 GB HBM2e, 500 W limit),
  FSDP 8, local batch 2, sequence 8192, selective activation checkpointing (here the `default`
  memory policy's saved set, on FSDP2): 5,762 tokens/s per GPU eager, 6,667 with torch.compile,
  8,532 with torch.compile and float8 (tensorwise).
- This project's seed (issue 37: "Qwen3 8B 51-52%", "Qwen3 235B at 32.4% MFU on 1,024 chips",
  on TPU): the chip kind and sequence are not stated there; the rows assume TPU v7x, the target
  the issue plans for, and sequence 4096, Qwen3's pre-training length (Qwen3 technical report).
  The plan's own layout is used (the seed's is not given).
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

from onboard.sizing.plan import CAPTURED_MOE, parse_target, plan_training, predict_layout
from onboard.sizing.plan_memory import Layout, PlanShape
from onboard.sizing.plan_time import COMPUTE_EFFICIENCY, EAGER_RATIO, FLOAT8_REALISED, Efficiency

TORCHTITAN = ("TorchTitan docs/performance.md, Table 1: Llama 3.1 8B on 8 x H100 (96 GB HBM2e, 500 W), FSDP 8, "
              "local batch 2, seq 8192, selective activation checkpointing")  # fmt: skip
SEED = "this project's seed, as issue 37 quotes it: on 1,024 TPU chips (kind not stated; v7x assumed, seq 4096)"


@dataclass(frozen=True)
class Published:
    id: str
    family: str
    flavor: str
    target: str
    seq_len: int
    source: str
    tokens_per_s_device: float | None = None
    mfu: float | None = None
    layout: Layout | None = None
    """The published layout; None: the plan chooses."""
    batch: int = 1
    policy: str = "none"
    data_parallel: str | None = None
    compiled: bool = True
    float8: bool = False
    memory_gib: int | None = None
    """The run's device memory where it differs from the table's (TorchTitan's 96 GB H100s)."""
    calibrates: str | None = None
    """The constant this row sets (None: held out)."""


PUBLISHED = (
    Published("torchtitan-llama3.1-8b-eager", "llama3", "8B", "h100:8", 8192, TORCHTITAN + "; FSDP, eager",
              tokens_per_s_device=5762, layout=Layout(8), batch=2, policy="default", data_parallel="fsdp2",
              compiled=False, memory_gib=96, calibrates="EAGER_RATIO"),
    Published("torchtitan-llama3.1-8b-compile", "llama3", "8B", "h100:8", 8192, TORCHTITAN + "; FSDP + torch.compile",
              tokens_per_s_device=6667, layout=Layout(8), batch=2, policy="default", data_parallel="fsdp2",
              memory_gib=96, calibrates="COMPUTE_EFFICIENCY['cuda']"),
    Published("torchtitan-llama3.1-8b-float8", "llama3", "8B", "h100:8", 8192,
              TORCHTITAN + "; FSDP + torch.compile + Float8", tokens_per_s_device=8532, layout=Layout(8), batch=2,
              policy="default", data_parallel="fsdp2", float8=True, memory_gib=96, calibrates="FLOAT8_REALISED"),
    Published("seed-qwen3-8b", "qwen3", "8B", "v7x:1024", 4096, SEED + "; Qwen3 8B at 51-52% MFU (51.5 taken)",
              mfu=0.515, calibrates="COMPUTE_EFFICIENCY['tpu']"),
    Published("seed-qwen3-235b-a22b", "qwen3_moe", "235B-A22B", "v7x:1024", 4096,
              SEED + "; Qwen3 235B-A22B at 32.4% MFU", mfu=0.324),
)  # fmt: skip


def _model(family: str, flavor: str):
    args = get_family(family).flavors[flavor]
    meta = build_meta(family, args)
    shape = ModelShape.from_model(meta, args)
    return args, PlanShape.from_model(meta, args, shape), count_params(meta)


_MODELS: dict[tuple[str, str], Any] = {}


def predicted(row: Published, eff: Efficiency | None = None) -> dict[str, Any]:
    """The plan's prediction for `row` beside its published figure (JSON-ready)."""
    key = (row.family, row.flavor)
    if key not in _MODELS:
        _MODELS[key] = _model(*key)
    args, ps, counts = _MODELS[key]
    target = parse_target(row.target)
    if row.memory_gib:
        target = replace(target, memory_bytes=row.memory_gib * GIB, memory_source=f"{row.memory_gib} GB (the run's)")
    kernels = TrainSetup(batch_size=1, seq_len=1, loss="fused_ce", moe=CAPTURED_MOE[target.device_type])
    eff = eff or Efficiency(COMPUTE_EFFICIENCY[target.device_type])
    fpt = lambda s: flops_per_token(args, s)  # noqa: E731
    if row.layout is not None:
        opt = predict_layout(ps, counts, fpt, target, row.layout, seq_len=row.seq_len, kernels=kernels,
                             batch=row.batch, policy=row.policy, data_parallel=row.data_parallel,
                             compiled=row.compiled, float8=row.float8, eff=eff)  # fmt: skip
    else:
        opt = plan_training(ps, counts, fpt, target, seq_len=row.seq_len, kernels=kernels, tp_plan=family_has_tp(row),
                            efficiency=eff, compiled=row.compiled, float8=row.float8).chosen  # fmt: skip
    step = opt.step
    out: dict[str, Any] = {
        "id": row.id, "model": f"{row.family} {row.flavor}", "target": row.target, "seq_len": row.seq_len,
        "layout": opt.layout.name, "policy": opt.policy, "batch": opt.batch, "fits_memory_model": opt.largest_batch
        >= max(1, opt.batch), "compiled": row.compiled, "float8": row.float8, "source": row.source,
        "calibrates": row.calibrates, "predicted_tokens_per_s_device": step.tokens_per_s_device,
        "predicted_mfu": step.mfu, "published_tokens_per_s_device": row.tokens_per_s_device,
        "published_mfu": row.mfu,
    }  # fmt: skip
    if row.tokens_per_s_device:
        out["ratio"] = step.tokens_per_s_device / row.tokens_per_s_device
        out["ratio_of"] = "tokens/s/device"
    else:
        out["ratio"] = step.mfu / row.mfu
        out["ratio_of"] = "MFU"
    return out


def family_has_tp(row: Published) -> bool:
    return row.family in TP_PLANS


def derive_constants(rounds: int = 3) -> dict[str, float]:
    """The constants plan_time.py holds, recomputed from PUBLISHED: each calibrating row's constant scaled
    until its prediction meets its figure (float8's by bisection: its effect is not proportional)."""
    eff = Efficiency(COMPUTE_EFFICIENCY["cuda"], EAGER_RATIO, FLOAT8_REALISED)
    tpu = COMPUTE_EFFICIENCY["tpu"]
    rows = {r.calibrates: r for r in PUBLISHED if r.calibrates}
    for _ in range(rounds):
        r = predicted(rows["COMPUTE_EFFICIENCY['cuda']"], eff)
        eff = replace(eff, compute=eff.compute / r["ratio"])
        r = predicted(rows["EAGER_RATIO"], eff)
        eff = replace(eff, eager_ratio=eff.eager_ratio / r["ratio"])
        r = predicted(rows["COMPUTE_EFFICIENCY['tpu']"], Efficiency(tpu, eff.eager_ratio, eff.float8_realised))
        tpu = tpu / r["ratio"]
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if predicted(rows["FLOAT8_REALISED"], replace(eff, float8_realised=mid))["ratio"] < 1:
            lo = mid
        else:
            hi = mid
    return {"COMPUTE_EFFICIENCY['cuda']": eff.compute, "COMPUTE_EFFICIENCY['tpu']": tpu,
            "EAGER_RATIO": eff.eager_ratio, "FLOAT8_REALISED": (lo + hi) / 2}  # fmt: skip


def constants_in_use() -> dict[str, float]:
    return {"COMPUTE_EFFICIENCY['cuda']": COMPUTE_EFFICIENCY["cuda"], "COMPUTE_EFFICIENCY['tpu']":
            COMPUTE_EFFICIENCY["tpu"], "EAGER_RATIO": EAGER_RATIO, "FLOAT8_REALISED": FLOAT8_REALISED}  # fmt: skip
