"""A layout's predicted step time: compute at a calibrated efficiency, plus a term per collective.

    step = predict_step(ps, lay, StepInputs(...), target)
    step.step_time_s, step.mfu, step.tokens_per_s_device, step.comm

Compute: the FLOPs one device executes per step (the model's 6 per active weight and attention,
a second forward under `full` recompute, every expert under the dense MoE kernel) over the bf16
peak times the compute efficiency of the device type (`COMPUTE_EFFICIENCY`), lowered for an eager
step (`EAGER_RATIO`); with float8 the linear layers' share runs faster by what float8 realised of
the chip's float8/bf16 peak ratio (`FLOAT8_REALISED`). Routed experts' matmuls are memory-bound
when an expert sees fewer rows than the chip's ridge point (peak / HBM bandwidth): their FLOPs
take ridge / rows longer (`expert_slowdown`). PP adds its bubble: (microbatches + pp - 1)
/ microbatches of the compute (interleaved: the pp - 1 warm-up slots cost 1/2 each).

Communication, bytes per device per step over the link the group crosses (hardware.py's table,
one direction): the group stays on the fast fabric (ICI, NVLink) while the devices it spans fit
one scale-up domain, else it crosses the data-centre network. The mesh orders dims pp, dp_replicate,
dp_shard, cp, tp from outer to inner (titan_core/parallel/mesh.py), so TP spans tp devices,
FSDP's dp_shard x cp group tp x dp_shard x cp, EP's ep x tp (ep is carved from dp_shard x cp).

- FSDP: per microbatch an all-gather of the bf16 weights for the forward, another for the backward
  (FSDP2 reshards after the forward; titan_core's SimpleFSDP keeps the first and gathers once), and
  a reduce-scatter of the fp32 gradients, each (n-1)/n of the stage's shardable bytes; experts over
  their edp ranks only; under PP once per step (pipelining defers reshard and gradient sync to the
  last microbatch). HSDP adds one fp32 all-reduce of the shard over dp_replicate per step.
- TP: four all-reduces of [tokens, dim] bf16 per layer per microbatch (two forward, two backward).
- EP: the token dispatch and combine all-to-alls, forward and backward: 4 x tokens x top_k x dim bf16
  per MoE layer, the (ep-1)/ep that leaves the rank; on a TPU torus each byte crosses the mean hop
  count of a compact ep-chip block (dims x side/4), which divides the link's rate.
- CP: the all-gather of K and V per layer forward, again in the backward, and the reduce-scatter of
  their gradients: 3 x 2 x tokens x kv_dim bf16 x (cp-1)/cp.
- PP: each microbatch's activations sent forward and gradients back: 2 x tokens x dim bf16.

Overlap, stated: FSDP's gathers and reduce-scatters (prefetched block by block), the HSDP
all-reduce (during the last backward), CP's K/V exchange (beside attention) and PP's sends run
under the compute, so they cost only what exceeds it; TP's all-reduces and EP's all-to-alls sit on
the critical path (titan_core has no async TP and no overlapped dispatch), so they add in full:

    step = max(compute x bubble, overlapped communication) + exposed communication

The constants come from published runs (onboard/sizing/plan_published.py, `bench/plan_vs_published.py`
prints each prediction beside its figure); `derive_constants` there recomputes them from the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from onboard.sizing.hardware import Hardware
from onboard.sizing import plan_memory
from onboard.sizing.plan_memory import INTERLEAVE, Layout, PlanShape, stage_layers

COMPUTE_EFFICIENCY = {"cuda": 0.39, "tpu": 0.515, "cpu": 0.5}
"""Fraction of the bf16 peak a compiled step's FLOPs reach, per device type.
cuda: TorchTitan, Llama 3.1 8B on 8 x H100, FSDP + torch.compile, 6,667 tokens/s per GPU (plan_published
row "torchtitan-llama3.1-8b-compile"): the efficiency at which this model predicts that figure.
tpu: the seed's Qwen3 8B at 51-52% MFU on 1,024 TPU chips (row "seed-qwen3-8b"), likewise.
cpu: no published figure; a CPU target's peak is this machine's own best matmul rate, and half of it
is the previous planner's assumption, kept (CPU plans serve the tests and small models)."""
EAGER_RATIO = 0.864
"""An eager step's efficiency over a compiled one's: TorchTitan's FSDP eager over FSDP + compile on
the same 8 x H100 run, 5,762 / 6,667 tokens/s (row "torchtitan-llama3.1-8b-eager")."""
FLOAT8_REALISED = 0.39
"""The share of a chip's float8/bf16 peak gain its linear layers realise: TorchTitan's float8 over
compiled bf16, 8,532 / 6,667 tokens/s on H100 (2x float8 peak), with attention's FLOPs staying bf16
(row "torchtitan-llama3.1-8b-float8"); a chip without faster float8 gains nothing."""


@dataclass(frozen=True)
class Efficiency:
    compute: float
    eager_ratio: float = EAGER_RATIO
    float8_realised: float = FLOAT8_REALISED


def efficiency_for(device_type: str, override: float | None = None) -> Efficiency:
    """The calibrated constants of a device type; `override` (--efficiency) replaces the compute one."""
    return Efficiency(override if override is not None else COMPUTE_EFFICIENCY[device_type])


@dataclass(frozen=True)
class StepInputs:
    batch: int
    microbatches: int
    seq_len: int
    policy: str
    data_parallel: str
    flops_per_token: float
    """The model's training FLOPs per token at seq_len."""
    attention_flops_per_token: float
    """Their attention-score share (stays bf16 under float8)."""
    inactive_params: int
    dense_moe: bool
    compiled: bool
    float8: bool = False


@dataclass(frozen=True)
class Collective:
    name: str
    bytes: float
    """Per device per step."""
    bandwidth: float
    """Bytes/s of the link it crosses, one direction (over the mean hop count on a torus for all-to-all)."""
    link: str
    overlapped: bool

    @property
    def seconds(self) -> float:
        return self.bytes / self.bandwidth if self.bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "bandwidth_bytes_per_s": self.bandwidth, "link": self.link,
                "overlapped": self.overlapped, "seconds": self.seconds}  # fmt: skip


@dataclass
class StepPrediction:
    tokens_per_device: float
    """Tokens one device's share of a step trains (the global batch over the world)."""
    model_flops: float
    executed_flops: float
    compute_s: float
    bubble: float
    """PP's bubble factor on the compute (1.0 without PP)."""
    step_time_s: float
    mfu: float
    tokens_per_s: float
    """Over the whole target."""
    tokens_per_s_device: float
    efficiency: float
    """The compute efficiency used (the eager ratio applied)."""
    how: str
    comm: list[Collective] = field(default_factory=list)

    @property
    def exposed_s(self) -> float:
        return sum(c.seconds for c in self.comm if not c.overlapped)

    @property
    def overlapped_s(self) -> float:
        return sum(c.seconds for c in self.comm if c.overlapped)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "comm"}
        return {**out, "exposed_comm_s": self.exposed_s, "overlapped_comm_s": self.overlapped_s,
                "comm": [c.to_dict() for c in self.comm]}  # fmt: skip


def _link(hw: Hardware | None, span: int) -> tuple[float, str]:
    """(bytes/s, name) of the link a group spanning `span` consecutive ranks crosses."""
    if hw is None:
        return math.inf, "this host"
    if span <= hw.scale_up_domain:
        return hw.scale_up_bw, "ICI" if hw.device_type == "tpu" else "NVLink"
    return hw.scale_out_bw, "DCN" if hw.device_type == "tpu" else "network"


def torus_hops(hw: Hardware | None, group: int) -> float:
    """Mean links one all-to-all byte crosses among `group` chips of a TPU torus laid out as a compact block
    (side group^(1/dims), dimension-ordered routing: dims x side / 4); 1 on a switched fabric."""
    if hw is None or not hw.torus_dims or group <= 1:
        return 1.0
    return max(1.0, hw.torus_dims * group ** (1 / hw.torus_dims) / 4)


def communication(ps: PlanShape, lay: Layout, x: StepInputs, hw: Hardware | None) -> list[Collective]:
    """Every collective of one step of `lay`, per device (module docstring); none on a CPU target, whose
    processes share one host's memory (not modelled)."""
    if hw is None:
        return []
    c, red = 2, 4  # bf16 gathers, fp32 gradient reduction (the plan's mixed_precision_reduce)
    frac = stage_layers(ps, lay.pp) / ps.n_layers
    layers = stage_layers(ps, lay.pp)
    moe_layers = math.ceil(ps.base.moe_layers * frac)
    tokens = x.batch * x.seq_len / lay.cp  # one microbatch's tokens on one rank
    micro = x.microbatches
    ends = (ps.embed_params + ps.head_params + ps.other_params) if lay.pp == 1 else max(
        ps.embed_params, (ps.head_params or ps.embed_params) + ps.other_params)  # fmt: skip
    # under PP a stage gathers once and reduces once per step (pipelining defers FSDP's reshard and sync)
    gathers = 2 if x.data_parallel in plan_memory.REGATHERS and lay.pp == 1 else 1
    fsdp_rounds = micro if lay.pp == 1 else 1
    out: list[Collective] = []

    def add(name: str, nbytes: float, span: int, overlapped: bool, hops: float = 1.0) -> None:
        if nbytes > 0:
            bw, link = _link(hw, span)
            out.append(Collective(name, nbytes, bw / hops, link, overlapped))

    shard = lay.dp_shard * lay.cp
    dense = (ps.block_params * frac + ends) / lay.tp
    add(f"FSDP all-gather x{gathers} + reduce-scatter over {shard}", fsdp_rounds * (shard - 1) / shard * dense
        * (gathers * c + red), lay.tp * shard, True)  # fmt: skip
    if ps.expert_params and lay.edp > 1:
        experts = ps.expert_params * frac / lay.ep
        add(f"experts' FSDP over edp {lay.edp}", fsdp_rounds * (lay.edp - 1) / lay.edp * experts * (gathers * c + red),
            lay.tp * shard, True)  # fmt: skip
    if lay.dp_replicate > 1:
        r = lay.dp_replicate
        stored = (ps.block_params * frac + ends) / (lay.tp * shard) + ps.expert_params * frac / shard
        add(f"HSDP all-reduce over {r}", 2 * (r - 1) / r * stored * red, lay.tp * shard * r, True)
    if lay.tp > 1:
        add(f"TP all-reduces over {lay.tp}", micro * layers * 4 * 2 * (lay.tp - 1) / lay.tp * tokens
            * ps.base.dim * c, lay.tp, False)  # fmt: skip
    if lay.ep > 1 and moe_layers:
        hops = torus_hops(hw, lay.ep)
        add(f"EP all-to-all over {lay.ep}", micro * moe_layers * 4 * (lay.ep - 1) / lay.ep * tokens / lay.tp
            * ps.base.top_k * ps.base.dim * c, lay.tp * lay.ep, False, hops)  # fmt: skip
    if lay.cp > 1:
        kv = 2 * ps.base.n_kv_heads * ps.base.head_dim / lay.tp
        add(f"CP K/V exchange over {lay.cp}", micro * layers * 3 * (lay.cp - 1) / lay.cp * x.batch * x.seq_len
            * kv * c, lay.tp * lay.cp, True)  # fmt: skip
    if lay.pp > 1:
        add(f"PP send/recv between {lay.pp} stages", micro * 2 * tokens * ps.base.dim * c / lay.tp, lay.world, True)
    return out


def expert_rows(ps: PlanShape, lay: Layout, x: StepInputs) -> float:
    """Tokens one local expert multiplies per microbatch: a rank's tokens x top_k spread over every expert,
    gathered from the ep ranks that share its experts."""
    return x.batch * x.seq_len / lay.cp * ps.base.top_k * lay.ep / max(1, ps.base.n_experts)


def expert_slowdown(ps: PlanShape, lay: Layout, x: StepInputs, hw: Hardware | None, peak_bf16: float) -> float:
    """The roofline of a routed expert's matmul: [rows, dim] x [dim, hidden] in bf16 does about `rows` FLOPs per
    weight byte, so below peak / HBM bandwidth FLOPs per byte (the chip's ridge) it waits on memory by
    ridge / rows. EP multiplies an expert's rows by ep; that, beside the gathers it saves, is what it buys."""
    if hw is None or x.dense_moe or not ps.is_moe:
        return 1.0
    return max(1.0, peak_bf16 / hw.hbm_bw / expert_rows(ps, lay, x))


def bubble(lay: Layout, microbatches: int) -> float:
    """PP's idle share as a factor on the compute: (m + pp - 1) / m; interleaved: (m + (pp - 1) / v) / m."""
    if lay.pp == 1:
        return 1.0
    warm = (lay.pp - 1) / (INTERLEAVE if lay.pp_schedule == "interleaved1F1B" else 1)
    return (microbatches + warm) / microbatches


def predict_step(ps: PlanShape, lay: Layout, x: StepInputs, *, peak_bf16: float, peak_fp8: float,
                 hw: Hardware | None, eff: Efficiency) -> StepPrediction:  # fmt: skip
    """The step time of `lay` (module docstring)."""
    world_share = lay.tp * lay.cp * lay.pp  # devices that share one data-parallel rank's sequences
    tokens = x.batch * x.seq_len * x.microbatches / world_share
    model = x.flops_per_token * tokens
    attention = x.attention_flops_per_token * tokens
    linear = model - attention
    parts = ["6 FLOPs per active weight per token plus attention"]
    if x.policy == "full":
        linear, attention = linear * 4 / 3, attention * 4 / 3  # the forward again: a third of forward + backward
        parts.append("+ a second forward (full recompute)")
    if x.dense_moe:
        linear += 6 * x.inactive_params * tokens
        parts.append("+ every expert on every token (dense MoE kernel)")
    executed = linear + attention
    efficiency = eff.compute * (1.0 if x.compiled else eff.eager_ratio)
    gain = 1 + (peak_fp8 / peak_bf16 - 1) * eff.float8_realised if x.float8 else 1.0
    # routed experts: their share of the linear FLOPs waits on HBM when an expert sees few rows
    experts = 0.0 if x.dense_moe or not ps.is_moe else 6 * ps.expert_params * ps.base.top_k / ps.base.n_experts * tokens
    slow = expert_slowdown(ps, lay, x, hw, peak_bf16)
    if slow > 1:
        parts.append(f"+ routed experts memory-bound x{slow:.3g} ({expert_rows(ps, lay, x):.0f} rows per expert)")
    compute = ((linear - experts + experts * slow) / gain + attention) / (peak_bf16 * efficiency)
    b = bubble(lay, x.microbatches)
    comm = communication(ps, lay, x, hw)
    overlapped = sum(cl.seconds for cl in comm if cl.overlapped)
    exposed = sum(cl.seconds for cl in comm if not cl.overlapped)
    step = max(compute * b, overlapped) + exposed
    mode = "compiled" if x.compiled else f"eager (x{eff.eager_ratio:g})"
    how = (" ".join(parts) + f", over {peak_bf16 / 1e12:g} TFLOP/s x {efficiency:.3g} ({mode})"
           + (f", linear layers in float8 x{gain:.3g}" if gain != 1 else "")
           + (f", PP bubble x{b:.3g}" if b != 1 else "")
           + "; communication overlapped under compute except TP all-reduces and EP all-to-alls")  # fmt: skip
    return StepPrediction(
        tokens_per_device=tokens, model_flops=model, executed_flops=executed, compute_s=compute, bubble=b,
        step_time_s=step, mfu=model / (step * peak_bf16), tokens_per_s=tokens * lay.world / step,
        tokens_per_s_device=tokens / step, efficiency=efficiency, how=how, comm=comm,
    )  # fmt: skip
