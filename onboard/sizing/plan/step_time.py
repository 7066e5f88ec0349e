"""A layout's predicted step time: compute at a calibrated efficiency per execution mode, the recompute its
memory policy costs, and the communication each collective leaves exposed.

    step = predict_step(ps, lay, StepInputs(...), target)
    step.step_time_s, step.mfu, step.tokens_per_s_device, step.comm

Compute: the FLOPs one device executes per step (the model's 6 per active weight and attention, a second
forward under `full` recompute, every expert under the dense MoE kernel) over the bf16 peak times the
device type's compute efficiency (`COMPUTE_EFFICIENCY`, a compiled step's) times the execution mode's
ratio (`MODE_RATIO`: eager, per-block compile, the Graph Trainer's captured step as is or compiled with
inductor, scan); with float8 the linear layers' share runs faster by what float8 realised of the chip's
float8/bf16 peak ratio (`FLOAT8_REALISED`). A memory policy that keeps the matmul outputs (`default`:
the Graph Trainer's, or eager selective-op checkpointing) recomputes the norms, activations and RoPE in
the backward: memory-bound work, priced as reading and writing those tensors once over HBM
(`recompute_bytes_per_token`). Routed experts' matmuls are memory-bound when an expert sees fewer rows
than the chip's ridge point (peak / HBM bandwidth): their FLOPs take ridge / rows longer. PP adds its
bubble: (microbatches + pp - 1) / microbatches of the compute (interleaved: the warm-up halves).

Communication, bytes per device per step over the link the group crosses (hardware.py's table, one
direction): the group stays on the fast fabric (ICI, NVLink) while the devices it spans fit one
scale-up domain, else it crosses the data-centre network. The mesh orders dims pp, dp_replicate,
dp_shard, cp, tp from outer to inner (titan_core/parallel/mesh.py), so TP spans tp devices, FSDP's
dp_shard x cp group tp x dp_shard x cp, EP's ep x tp (ep is carved from dp_shard x cp).

- FSDP: per microbatch an all-gather of the bf16 weights for the forward, another for the backward
  when the kind gathers again (FSDP2, SimpleFSDP re-gathering), and a reduce-scatter of the fp32
  gradients, each (n-1)/n of the stage's shardable bytes; experts over their edp ranks only; under PP
  once per step. HSDP adds one fp32 all-reduce of the shard over dp_replicate per step.
- TP: four all-reduces of [tokens, dim] bf16 per layer per microbatch (two forward, two backward).
- EP: the dispatch and combine all-to-alls, forward and backward: 4 x tokens x top_k x dim bf16 per
  MoE layer, the (ep-1)/ep that leaves the rank; on a TPU torus each byte crosses the mean hop count
  of a compact ep-chip block (dims x side/4), which divides the link's rate.
- CP: the all-gather of K and V per layer forward, again in the backward, and the reduce-scatter of
  their gradients: 3 x 2 x tokens x kv_dim bf16 x (cp-1)/cp.
- PP: each microbatch's activations sent forward and gradients back: 2 x tokens x dim bf16.

Exposed, not assumed hidden (`Collective.exposed_s`): a collective is hidden only where something runs
it beside the compute. FSDP2 prefetches the next block's gather and reduce-scatters behind the backward,
and a whole step captured on a TPU is one XLA program whose scheduler runs its collectives
asynchronously: there, per layer, a gather costs what exceeds that layer's forward (the backward's
gather and reduce-scatter what exceeds its backward), plus the first gather and the last reduce-scatter
in full; the HSDP all-reduce what exceeds the backward. SimpleFSDP anywhere else gathers inline, where
the parametrization is read (titan_core has no bucketing or reordering pass): exposed in full. TP's
all-reduces, EP's all-to-alls and CP's K/V all-gather sit on the critical path (titan_core has no async
TP, no overlapped dispatch, a blocking gather before attention). PP's sends run beside the other
stages' compute: exposed only past it.

    step = compute x bubble + sum of exposed seconds

The constants come from published runs (onboard/sizing/plan/published.py; `bench/plan_vs_published.py`
prints every prediction beside its figure, fitted rows apart from held-out ones); `derive_constants`
there recomputes them from the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from titan_core.config.execution_modes import MODES as EXECUTION_MODES
from titan_core.memory.shape import ModelShape

from onboard.sizing.plan.hardware import Hardware
from onboard.sizing.plan import layout_memory as plan_memory
from onboard.sizing.plan.layout_memory import INTERLEAVE, Layout, stage_layers

COMPUTE_EFFICIENCY = {"cuda": 0.398, "tpu": 0.768, "cpu": 0.5}
"""Fraction of the bf16 peak a compiled step's executed FLOPs reach, per device type (plan/published.py's
`derive_constants` recomputes each from its row).
cuda: TorchTitan, Llama 3.1 8B on 8 x H100, FSDP + torch.compile, 6,667 tokens/s per GPU (row
"torchtitan-llama3.1-8b-compile"): the efficiency at which this model predicts that figure.
tpu: MaxText, Llama 3.1 70B on 64 TPU v7x chips at seq 8192, 2,686.98 tokens/s per chip (row
"maxtext-llama3.1-70b-v7x64"), a whole step jitted and scanned, recomputing 90% of its linear FLOPs (priced
as `full`); high because the FLOPs here count causal attention whole where splash attention skips the
masked half.
cpu: no published figure; a CPU target's peak is this machine's own best matmul rate, and half of it
is the previous planner's assumption, kept (CPU plans serve the tests and small models)."""
EAGER_RATIO = 0.862
"""An eager step's efficiency over a per-block compiled one's: TorchTitan's FSDP eager over FSDP + compile on
the same 8 x H100 run, 5,762 / 6,667 tokens/s (row "torchtitan-llama3.1-8b-eager")."""
GRAPH_AS_IS_RATIO = 0.901
"""The Graph Trainer's captured step run as traced (graph_trainer.compile = none: every aten op its own
kernel) over a compiled step: TorchTitan's whole-graph SimpleFSDP with the aot_eager backend ran Llama 3 8B on
8 x H100 at 7,227 tokens/s per GPU where FSDP2 eager ran 7,380 (PR pytorch/torchtitan#1881; row
"torchtitan-simplefsdp-aot-eager", judged against its pair): the ratio at which this model, which exposes
SimpleFSDP's inline gathers in full, predicts that pair."""
GRAPH_INDUCTOR_RATIO = 1.0
"""The captured step compiled whole by inductor over a per-block compiled step: no published run compares
them; inductor generates the same fused kernels for the same ops, so the ratio is 1 (an assumption, said in
every prediction's `how`)."""
SCAN_RATIO = 1.0
"""A scanned captured step over the same step unrolled: scan traces one block and loops it, which saves
compile time, not step time; no published same-run comparison exists (MaxText scans by default, and the
TPU efficiency above is fitted on a scanned row)."""
FLOAT8_REALISED = 0.401
"""The share of a chip's float8/bf16 peak gain its linear layers realise: TorchTitan's float8 over
compiled bf16, 8,532 / 6,667 tokens/s on H100 (2x float8 peak), with attention's FLOPs staying bf16
(row "torchtitan-llama3.1-8b-float8"); a chip without faster float8 gains nothing."""
MODES = (*EXECUTION_MODES, "scan")
"""Execution modes a plan prices: titan_core's, and scan, the Graph Trainer's captured step scanned over its layers."""


def mode_ratio(mode: str, captured_compiled: bool, eff: Efficiency) -> tuple[float, str]:
    """(the mode's efficiency over a per-block compiled step, how it is named in a prediction's `how`)."""
    if mode == "compile":
        return 1.0, "per-block compile"
    if mode == "eager":
        return eff.eager_ratio, f"eager x{eff.eager_ratio:g}"
    graph = eff.graph_inductor_ratio if captured_compiled else eff.graph_as_is_ratio
    name = "captured step compiled by inductor (x1: assumed, no published comparison)" if captured_compiled else \
        f"captured step as traced x{eff.graph_as_is_ratio:g}"
    if mode == "scan":
        return graph * SCAN_RATIO, name + ", scanned over its layers"
    return graph, name


@dataclass(frozen=True)
class Efficiency:
    compute: float
    eager_ratio: float = EAGER_RATIO
    float8_realised: float = FLOAT8_REALISED
    graph_as_is_ratio: float = GRAPH_AS_IS_RATIO
    graph_inductor_ratio: float = GRAPH_INDUCTOR_RATIO


def efficiency_for(device_type: str, override: float | None = None) -> Efficiency:
    """The calibrated constants of a device type; `override` (--efficiency) replaces the compute one."""
    return Efficiency(override if override is not None else COMPUTE_EFFICIENCY[device_type])


@dataclass(frozen=True)
class StepInputs:
    batch: int
    microbatches: int
    seq_len: int
    policy: str
    """What the step saves (plan_memory.MemSetup.policy): full recomputes the forward."""
    data_parallel: str
    flops_per_token: float
    """The model's training FLOPs per token at seq_len."""
    attention_flops_per_token: float
    """Their attention-score share (stays bf16 under float8)."""
    inactive_params: int
    dense_moe: bool
    mode: str = "compile"
    """eager | compile | graph_trainer | scan (MODES)."""
    captured_compiled: bool = False
    """The captured step is compiled by inductor (graph_trainer.compile); else it runs as traced."""
    float8: bool = False
    recompute_bytes_per_token: float = 0.0
    """Bytes of the tensors the memory policy recomputes, per token over the stage's layers (what the eager
    step saves beyond what the policy keeps): the backward reads and writes them once more."""

    @property
    def compiled(self) -> bool:
        return self.mode != "eager"


@dataclass(frozen=True)
class Collective:
    name: str
    bytes: float
    """Per device per step."""
    bandwidth: float
    """Bytes/s of the link it crosses, one direction (over the mean hop count on a torus for all-to-all)."""
    link: str
    exposed_s: float
    """Seconds of it the compute does not hide (module docstring)."""
    overlap: str
    """Why that much: what runs it beside the compute, or why nothing does."""

    @property
    def seconds(self) -> float:
        return self.bytes / self.bandwidth if self.bytes else 0.0

    @property
    def overlapped(self) -> bool:
        """Some of it is hidden under the compute."""
        return self.exposed_s < self.seconds

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "bandwidth_bytes_per_s": self.bandwidth, "link": self.link,
                "seconds": self.seconds, "exposed_seconds": self.exposed_s, "overlap": self.overlap}  # fmt: skip


@dataclass
class StepPrediction:
    tokens_per_device: float
    """Tokens one device's share of a step trains (the global batch over the world)."""
    model_flops: float
    executed_flops: float
    compute_s: float
    """The FLOPs at the mode's efficiency, plus the memory policy's recompute (before the bubble)."""
    recompute_s: float
    """Of compute_s: the memory-bound recompute of the tensors the policy does not keep."""
    bubble: float
    """PP's bubble factor on the compute (1.0 without PP)."""
    step_time_s: float
    mfu: float
    tokens_per_s: float
    """Over the whole target."""
    tokens_per_s_device: float
    efficiency: float
    """The compute efficiency used (the mode's ratio applied)."""
    how: str
    comm: list[Collective] = field(default_factory=list)

    @property
    def exposed_s(self) -> float:
        return sum(c.exposed_s for c in self.comm)

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.comm)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "comm"}
        return {**out, "exposed_comm_s": self.exposed_s, "hidden_comm_s": self.comm_s - self.exposed_s,
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


def overlaps(x: StepInputs, hw: Hardware | None) -> str | None:
    """What runs FSDP's collectives beside the compute for this step, or None when they run inline."""
    if x.data_parallel == "fsdp2":
        return "FSDP2 prefetches the next block's gather and reduce-scatters behind the backward"
    if hw is not None and hw.device_type == "tpu" and x.mode in ("graph_trainer", "scan"):
        return "the captured step is one XLA program whose scheduler runs its collectives asynchronously"
    return None


def communication(ps: ModelShape, lay: Layout, x: StepInputs, hw: Hardware | None, compute_s: float = 0.0
                  ) -> list[Collective]:  # fmt: skip
    """Every collective of one step of `lay`, per device, with its exposed seconds against `compute_s` (module
    docstring); none on a CPU target, whose processes share one host's memory (not modelled)."""
    if hw is None:
        return []
    c, red = 2, 4  # bf16 gathers, fp32 gradient reduction (the plan's mixed_precision_reduce)
    layers = stage_layers(ps, lay.pp)
    frac = layers / ps.n_layers
    moe_layers = math.ceil(ps.moe_layers * frac)
    tokens = x.batch * x.seq_len / lay.cp  # one microbatch's tokens on one rank
    micro = x.microbatches
    ends = (ps.embed_params + ps.head_params + ps.other_params) if lay.pp == 1 else max(
        ps.embed_params, (ps.head_params or ps.embed_params) + ps.other_params)  # fmt: skip
    # under PP a stage gathers once and reduces once per step (pipelining defers FSDP's reshard and sync)
    gathers = 2 if x.data_parallel in plan_memory.REGATHERS and lay.pp == 1 else 1
    rounds = micro if lay.pp == 1 else 1
    # one round's forward and backward time per layer: the forward is a third of the FLOPs, the backward the
    # rest with its recompute
    recompute = 1.0 if x.policy == "full" else 0.0
    per_layer = compute_s / max(1, rounds * layers)
    fwd, bwd = per_layer / (3 + recompute), per_layer * (2 + recompute) / (3 + recompute)
    hide = overlaps(x, hw)
    out: list[Collective] = []

    def link(span: int, hops: float = 1.0) -> tuple[float, str]:
        bw, name = _link(hw, span)
        return bw / hops, name

    def fsdp(name: str, gather_bytes: float, reduce_bytes: float, span: int) -> None:
        """A gather (and its re-gather) and a reduce-scatter per round, each layer's share against that layer's
        forward / backward where something overlaps them, else in full."""
        if gather_bytes + reduce_bytes <= 0:
            return
        bw, ln = link(span)
        total = rounds * (gathers * gather_bytes + reduce_bytes)
        if hide is None:
            out.append(Collective(name, total, bw, ln, total / bw, "SimpleFSDP gathers inline, where the weight is "
                                  "read (no prefetch, bucketing or reordering in titan_core): exposed in full"))
            return
        g, r = gather_bytes / layers / bw, reduce_bytes / layers / bw
        regather = g if gathers == 2 else 0.0
        exposed = rounds * (g + r + layers * (max(0.0, g - fwd) + max(0.0, regather + r - bwd)))
        out.append(Collective(name, total, bw, ln, min(exposed, total / bw), f"{hide}: per layer what exceeds the "
                              "layer's compute, plus the first gather and the last reduce-scatter"))  # fmt: skip

    shard = lay.dp_shard * lay.cp
    dense = (ps.block_params * frac + ends) / lay.tp
    part = (shard - 1) / shard
    fsdp(f"FSDP all-gather x{gathers} + reduce-scatter over {shard}", part * dense * c, part * dense * red,
         lay.tp * shard)
    if ps.expert_params and lay.edp > 1:
        experts = ps.expert_params * frac / lay.ep
        part_e = (lay.edp - 1) / lay.edp
        fsdp(f"experts' FSDP over edp {lay.edp}", part_e * experts * c, part_e * experts * red, lay.tp * shard)
    if lay.dp_replicate > 1:
        r = lay.dp_replicate
        stored = (ps.block_params * frac + ends) / (lay.tp * shard) + ps.expert_params * frac / shard
        nbytes = 2 * (r - 1) / r * stored * red
        bw, ln = link(lay.tp * shard * r)
        back = bwd * layers * rounds
        exposed = nbytes / bw if hide is None else max(0.0, nbytes / bw - back) + nbytes / bw / layers
        out.append(Collective(f"HSDP all-reduce over {r}", nbytes, bw, ln, min(exposed, nbytes / bw),
                              "beside the backward" if hide else "inline with SimpleFSDP's gradient reduction"))
    if lay.tp > 1:
        nbytes = micro * layers * 4 * 2 * (lay.tp - 1) / lay.tp * tokens * ps.dim * c
        bw, ln = link(lay.tp)
        out.append(Collective(f"TP all-reduces over {lay.tp}", nbytes, bw, ln, nbytes / bw,
                              "on the critical path: titan_core has no async TP"))
    if lay.ep > 1 and moe_layers:
        nbytes = micro * moe_layers * 4 * (lay.ep - 1) / lay.ep * tokens / lay.tp * ps.top_k * ps.dim * c
        bw, ln = link(lay.tp * lay.ep, torus_hops(hw, lay.ep))
        out.append(Collective(f"EP all-to-all over {lay.ep}", nbytes, bw, ln, nbytes / bw,
                              "on the critical path: the experts wait for their tokens"))
    if lay.cp > 1:
        kv = 2 * ps.n_kv_heads * ps.head_dim / lay.tp
        nbytes = micro * layers * 3 * (lay.cp - 1) / lay.cp * x.batch * x.seq_len * kv * c
        bw, ln = link(lay.tp * lay.cp)
        out.append(Collective(f"CP K/V exchange over {lay.cp}", nbytes, bw, ln, nbytes / bw,
                              "on the critical path: attention waits for the gathered K and V"))
    if lay.pp > 1:
        nbytes = micro * 2 * tokens * ps.dim * c / lay.tp
        bw, ln = link(lay.world)
        out.append(Collective(f"PP send/recv between {lay.pp} stages", nbytes, bw, ln,
                              max(0.0, nbytes / bw - compute_s), "beside the other stages' compute"))
    return out


def expert_rows(ps: ModelShape, lay: Layout, x: StepInputs) -> float:
    """Tokens one local expert multiplies per microbatch: a rank's tokens x top_k spread over every expert,
    gathered from the ep ranks that share its experts."""
    return x.batch * x.seq_len / lay.cp * ps.top_k * lay.ep / max(1, ps.n_experts)


def expert_slowdown(ps: ModelShape, lay: Layout, x: StepInputs, hw: Hardware | None, peak_bf16: float) -> float:
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


def predict_step(ps: ModelShape, lay: Layout, x: StepInputs, *, peak_bf16: float, peak_fp8: float,
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
    ratio, mode = mode_ratio(x.mode, x.captured_compiled, eff)
    efficiency = eff.compute * ratio
    gain = 1 + (peak_fp8 / peak_bf16 - 1) * eff.float8_realised if x.float8 else 1.0
    # routed experts: their share of the linear FLOPs waits on HBM when an expert sees few rows
    experts = 0.0 if x.dense_moe or not ps.is_moe else 6 * ps.expert_params * ps.top_k / ps.n_experts * tokens
    slow = expert_slowdown(ps, lay, x, hw, peak_bf16)
    if slow > 1:
        parts.append(f"+ routed experts memory-bound x{slow:.3g} ({expert_rows(ps, lay, x):.0f} rows per expert)")
    compute = ((linear - experts + experts * slow) / gain + attention) / (peak_bf16 * efficiency)
    # the tensors the policy recomputes: read and written once more over HBM (one rank's tokens on its layers)
    recompute = 0.0
    if hw is not None and x.recompute_bytes_per_token:
        recompute = 2 * x.recompute_bytes_per_token * x.batch * x.seq_len / lay.cp * x.microbatches / hw.hbm_bw
        parts.append(f"+ {recompute:.3g} s recomputing what the {x.policy} policy does not keep (over HBM)")
    compute += recompute
    b = bubble(lay, x.microbatches)
    comm = communication(ps, lay, x, hw, compute)
    exposed = sum(cl.exposed_s for cl in comm)
    step = compute * b + exposed
    how = (" ".join(parts) + f", over {peak_bf16 / 1e12:g} TFLOP/s x {efficiency:.3g} ({mode})"
           + (f", linear layers in float8 x{gain:.3g}" if gain != 1 else "")
           + (f", PP bubble x{b:.3g}" if b != 1 else "")
           + (f"; {exposed:.3g} s of communication exposed (per collective in `comm`)" if comm else ""))  # fmt: skip
    return StepPrediction(
        tokens_per_device=tokens, model_flops=model, executed_flops=executed, compute_s=compute,
        recompute_s=recompute, bubble=b, step_time_s=step, mfu=model / (step * peak_bf16),
        tokens_per_s=tokens * lay.world / step, tokens_per_s_device=tokens / step, efficiency=efficiency, how=how,
        comm=comm,
    )  # fmt: skip
