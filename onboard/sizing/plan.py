"""A plan for training a full-size model on a target: per-device memory under each sharding and
memory policy, the largest batch that fits, and a roofline step time. Predictions, not runs.

    target = parse_target("v7x:64")
    plan = plan_training(shape, counts, fpt, target, seq_len=4096, kernels=setup, tp_plan=False)
    plan.chosen, plan.to_dict()

The memory model is titan_core/memory/estimate.py, the same code that refuses an oversized
run before it allocates, with `materialise_sharded=True`: a planned run materialises each
rank's shard, not the whole model per rank (the trainer today builds the whole fp32 model on
every rank first; the plan says so where that moment would not fit one device, as for a 235B model).
Training is fp32 master weights with bf16 compute (mixed precision), AdamW, on accelerators.

Options, each sharding with each memory policy:
- shardings: FSDP over all COUNT devices; HSDP with the smallest shard group (a multiple of
  the chips of one host) that fits, replicated across the groups; TP over one host's chips
  x FSDP over the hosts, where the family has a TP plan;
- policies: none (the eager step; FSDP2's per-block gathers, or SimpleFSDP under TP, which
  composes with SimpleFSDP only) and the Graph Trainer's default / full / offload (a
  captured step: SimpleFSDP, whose gathered copies of every weight the memory model keeps
  through the step, since the memory policy never recomputes a collective).

The chosen option has the highest predicted MFU among those that fit, then the largest
batch, then the simplest (the order above). Host offload with the graph splitter is needed
when nothing on the device fits and an offload option does; scan is recommended when the
chosen step is captured and its blocks are identical (the unrolled trace grows with depth;
the memory model counts no bytes for it either way).

Step time, a roofline bound: the FLOPs one device executes per step (the model's 6 per
active weight plus attention, a second forward under `full` recompute, every expert under
the dense MoE kernel) over its bf16 peak at a stated efficiency; MFU is the model's FLOPs
over peak in that time. Communication is assumed hidden behind compute, offload's host
transfers too: a bound, and labelled a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from titan_core.memory.activations import layer_bytes_per_token
from titan_core.config.loader import ConfigError
from titan_core.memory.budget import GIB, GPU_HBM_GIB, TPU_HBM_GIB
from titan_core.runtime.devices import PEAK_BF16_FLOPS
from titan_core.memory.estimate import MemoryEstimate, ModelShape, TrainSetup, estimate_memory, format_bytes, tp_local

HEADROOM = 0.9
"""Fraction of a device's memory a plan fills: the rest is for what the estimate does not count
(the runtime's reservation, allocator fragmentation, kernel workspaces inside one op)."""
EFFICIENCY = 0.5
"""Assumed fraction of the bf16 peak the executed FLOPs reach (published large dense runs on TPU
and H100 report 40-57% MFU); a plan states it beside every step time."""
MAX_BATCH = 4096
GRAPH_POLICIES = ("default", "full", "offload")

# chips per host: the fast-interconnect group TP stays within, and the processes torchrun starts per host
PER_HOST = {
    "v5e": 4,  # Google Cloud TPU v5e: multi-host slices are VMs of 4 chips (ct5lp-hightpu-4t)
    "v5p": 4,  # Google Cloud TPU v5p: 4 chips per VM
    "v6e": 4,  # Google Cloud TPU v6e: multi-host slices are VMs of 4 chips (ct6e-standard-4t)
    "v7x": 4,  # Google Cloud TPU7x (Ironwood): 4 chips per VM
    "h100": 8, "h200": 8, "b200": 8,  # NVIDIA HGX / DGX boards: 8 GPUs joined by NVLink
    "mi300x": 8,  # AMD Instinct MI300X platform: 8 GPUs joined by Infinity Fabric
}  # fmt: skip
KINDS = ("v5e", "v5p", "v6e", "v7x", "h100", "h200", "b200", "mi300x", "cpu")


@dataclass(frozen=True)
class Target:
    kind: str
    count: int
    device_type: str
    """tpu | cuda | cpu: the trainer's [device] type."""
    memory_bytes: int
    """Memory of one device (HBM; a CPU process's share of this host's)."""
    memory_source: str
    peak_flops: float
    per_host: int

    @property
    def budget(self) -> int:
        return int(self.memory_bytes * HEADROOM)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.count}"


def parse_target(spec: str, *, cpu_memory: int | None = None, cpu_peak: float | None = None) -> Target:
    """`KIND[:COUNT]` (COUNT default 1) -> Target; ConfigError naming the rule. The cpu kind needs
    this host's memory and measured peak (`cpu_memory` for one process, `cpu_peak`)."""
    kind, _, count_text = str(spec).strip().lower().partition(":")
    if kind not in KINDS:
        raise ConfigError(f"--target '{spec}': KIND must be one of {', '.join(KINDS)}")
    count = 1
    if count_text:
        if not count_text.isdigit() or int(count_text) < 1:
            raise ConfigError(f"--target '{spec}': COUNT must be a positive integer of devices")
        count = int(count_text)
    if kind == "cpu":
        if cpu_memory is None or cpu_peak is None:
            raise ConfigError("--target cpu: this host's memory or CPU peak is unknown here")
        return Target("cpu", count, "cpu", cpu_memory // count, "this host's memory shared by "
                      f"{count} process(es)", cpu_peak, count)  # fmt: skip
    per_host = PER_HOST[kind]
    if count > per_host and count % per_host:
        raise ConfigError(f"--target '{spec}': {kind} comes {per_host} per host; COUNT must be a multiple of it")
    if kind in TPU_HBM_GIB:
        return Target(kind, count, "tpu", TPU_HBM_GIB[kind] * GIB, f"HBM of one TPU {kind} chip (table)",
                      PEAK_BF16_FLOPS[f"tpu {kind}"], min(per_host, count))  # fmt: skip
    return Target(kind, count, "cuda", GPU_HBM_GIB[kind] * GIB, f"HBM of one {kind.upper()} (table)",
                  PEAK_BF16_FLOPS[kind], min(per_host, count))  # fmt: skip


@dataclass(frozen=True)
class Sharding:
    kind: str
    """FSDP | HSDP | TP x FSDP"""
    dp_shard: int
    dp_replicate: int = 1
    tp: int = 1

    @property
    def name(self) -> str:
        if self.kind == "HSDP":
            return f"HSDP: shard {self.dp_shard} x replicate {self.dp_replicate}"
        if self.tp > 1:
            return f"TP {self.tp} x FSDP {self.dp_shard}"
        return f"FSDP {self.dp_shard}"


@dataclass
class Option:
    sharding: Sharding
    policy: str
    data_parallel: str
    batch: int
    """Largest per-device batch (per TP group under TP) that fits; 0: not even one sequence."""
    estimate: MemoryEstimate
    """At `batch` (at batch 1 when none fits)."""

    @property
    def fits(self) -> bool:
        return self.batch > 0

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "sharding": self.sharding.name, "policy": self.policy, "data_parallel": self.data_parallel,
            "largest_batch": self.batch, "peak_bytes": e.total, "peak_at": e.phase, "params_bytes": e.params,
            "grads_bytes": e.grads, "optimizer_bytes": e.optimizer_state, "gathered_params_bytes": e.gathered_params,
            "activations_bytes": e.activations, "activations_host_bytes": e.activations_host,
            "workspace_bytes": max(e.backward_workspace, e.optimizer_workspace),
        }  # fmt: skip


@dataclass
class StepPrediction:
    tokens_per_device: int
    model_flops: float
    executed_flops: float
    step_time_s: float
    mfu: float
    tokens_per_s: float
    efficiency: float
    how: str


@dataclass
class Plan:
    target: Target
    seq_len: int
    params_total: int
    params_active: int
    flops_per_token: float
    seq_len_asked: int
    options: list[Option]
    activations_per_token_layer: dict[str, int]
    """Per memory policy: bytes one layer keeps per token (layers averaged), in device memory or on the host."""
    chosen: Option | None
    offload: tuple[bool, str]
    scan: tuple[bool, str]
    step: StepPrediction | None
    notes: list[str] = field(default_factory=list)
    asked_options: list[Option] = field(default_factory=list)
    """The options at the sequence length asked for, when the plan had to shorten it."""

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        return {
            "target": {
                "kind": t.kind,
                "count": t.count,
                "device_type": t.device_type,
                "memory_bytes": t.memory_bytes,
                "memory_source": t.memory_source,
                "budget_bytes": t.budget,
                "headroom": HEADROOM,
                "peak_bf16_flops": t.peak_flops,
                "per_host": t.per_host,
            },
            "seq_len": self.seq_len,
            "seq_len_asked": self.seq_len_asked,
            "params_total": self.params_total,
            "params_active": self.params_active,
            "flops_per_token": self.flops_per_token,
            "activations_per_token_per_layer": self.activations_per_token_layer,
            "options": [o.to_dict() for o in self.options],
            "options_at_seq_asked": [o.to_dict() for o in self.asked_options],
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "offload_needed": self.offload[0],
            "offload_why": self.offload[1],
            "scan_needed": self.scan[0],
            "scan_why": self.scan[1],
            "prediction": vars(self.step) if self.step else None,
            "notes": self.notes,
        }


# ---- options ---------------------------------------------------------------------------------
def shardings(target: Target, shape: ModelShape, *, tp_plan: bool) -> list[Sharding]:
    """FSDP over every device, HSDP shard groups (multiples of a host's chips below COUNT), and
    TP over one host's chips where the family has a plan and the widths split evenly."""
    n = target.count
    out = [Sharding("FSDP", n)]
    group = target.per_host
    while group < n:
        if n % group == 0:
            out.append(Sharding("HSDP", group, n // group))
        group *= 2
    t = target.per_host
    while tp_plan and t > 1 and not all(w % t == 0 for w in (shape.n_heads, shape.n_kv_heads, shape.ffn_hidden_dim)):
        t //= 2
    if tp_plan and t > 1 and n % t == 0:
        out.append(Sharding("TP x FSDP", n // t, 1, t))
    return out


CAPTURED_MOE = {"cuda": "grouped_mm", "tpu": "tokamax", "cpu": "dense"}
"""The experts kernel a captured step runs when the recipe's is the host-syncing loop: routed and
static-shaped on accelerators (torch._grouped_mm in bf16; ragged_dot through the JAX bridge),
the dense one on a CPU. Not run here: a prediction, to verify on the target."""


def moe_kernel(base: TrainSetup, target: Target, policy: str) -> str:
    return CAPTURED_MOE[target.device_type] if policy in GRAPH_POLICIES and base.moe == "loop" else base.moe


def _setup(base: TrainSetup, target: Target, s: Sharding, policy: str, seq_len: int) -> TrainSetup:
    captured = policy in GRAPH_POLICIES
    dp = "simple_fsdp" if captured or s.tp > 1 else "fsdp2"
    compute = "float32" if target.device_type == "cpu" else "bfloat16"
    return replace(
        base, batch_size=1, seq_len=seq_len, grad_accum=1, param_dtype="float32", compute_dtype=compute,
        shard_degree=s.dp_shard * s.tp, tp=s.tp, data_parallel=dp, memory_policy=policy,
        device_type=target.device_type, runtime_bytes=0, materialise_sharded=True,
        moe=moe_kernel(base, target, policy),
    )  # fmt: skip


def materialise_note(shape: ModelShape, target: Target, setup: TrainSetup) -> str | None:
    """The note that the plan's sharded materialisation matters, only when it does: when today's
    trainer, which builds the whole fp32 model on every rank before sharding it, would not fit one
    device (the memory model's own materialise term, unsharded)."""
    whole = estimate_memory(shape, replace(setup, materialise_sharded=False)).materialise
    if whole <= target.budget:
        return None
    return (
        f"materialise_sharded: each rank materialises only its shard; today's trainer builds the whole fp32 "
        f"model on every rank first, {format_bytes(whole)}, over one device's {format_bytes(target.budget)}"
    )


def _largest_batch(shape: ModelShape, setup: TrainSetup, budget: int) -> tuple[int, MemoryEstimate]:
    """The largest batch in [1, MAX_BATCH] that fits (the estimate grows with the batch), and its estimate."""

    def est(b: int) -> MemoryEstimate:
        return estimate_memory(shape, replace(setup, batch_size=b))

    one = est(1)
    if one.total > budget:
        return 0, one
    lo, hi = 1, MAX_BATCH
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if est(mid).total <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo, est(lo)


def options(shape: ModelShape, target: Target, base: TrainSetup, seq_len: int, *, tp_plan: bool) -> list[Option]:
    """Every sharding with every memory policy that applies on the target (offload: not on a CPU,
    where host and device are one memory); HSDP keeps, per policy, the smallest group that fits."""
    policies = ("none", "default", "full") + (("offload",) if target.device_type != "cpu" else ())
    out: list[Option] = []
    all_shardings = shardings(target, shape, tp_plan=tp_plan)
    for policy in policies:
        hsdp: list[Option] = []
        for s in all_shardings:
            setup = _setup(base, target, s, policy, seq_len)
            batch, est = _largest_batch(shape, setup, target.budget)
            opt = Option(s, policy, setup.data_parallel, batch, est)
            if s.kind == "HSDP":
                hsdp.append(opt)
            else:
                out.append(opt)
        if hsdp:  # the smallest shard group that fits, else the largest tried
            out.append(next((o for o in hsdp if o.fits), hsdp[-1]))
    order = {"FSDP": 0, "HSDP": 1, "TP x FSDP": 2}
    rank = ("none",) + GRAPH_POLICIES
    return sorted(out, key=lambda o: (order[o.sharding.kind], rank.index(o.policy)))


# ---- the step --------------------------------------------------------------------------------
def predict_step(
    option: Option,
    target: Target,
    flops_per_token: float,
    seq_len: int,
    *,
    inactive_params: int,
    dense_moe: bool,
    efficiency: float = EFFICIENCY,
) -> StepPrediction:
    """The roofline step time of `option` (module docstring): FLOPs per device over peak x efficiency."""
    tp = option.sharding.tp
    tokens = option.batch * seq_len
    model = flops_per_token * tokens / tp  # a TP group shares its sequences' FLOPs
    executed = model
    parts = ["6 FLOPs per active weight per token plus attention"]
    if option.policy == "full":
        executed += model / 3  # the forward again (a third of forward + backward)
        parts.append("+ a second forward (full recompute)")
    if dense_moe:
        executed += 6 * inactive_params * tokens / tp
        parts.append("+ every expert on every token (dense MoE kernel)")
    time_s = executed / (target.peak_flops * efficiency)
    dp = target.count // tp
    return StepPrediction(
        tokens_per_device=tokens // tp, model_flops=model, executed_flops=executed, step_time_s=time_s,
        mfu=model / (time_s * target.peak_flops), tokens_per_s=tokens * dp / time_s, efficiency=efficiency,
        how=" ".join(parts) + f", over {target.peak_flops / 1e12:g} TFLOP/s x {efficiency:g}",
    )  # fmt: skip


def _mfu_of(option: Option, *, dense_moe: bool, inactive_frac: float) -> float:
    """Relative MFU of an option: the model's FLOPs over what the device executes (roofline)."""
    executed = 1.0 + (1 / 3 if option.policy == "full" else 0.0) + (inactive_frac if dense_moe else 0.0)
    return 1.0 / executed


def activation_table(shape: ModelShape, base: TrainSetup, target: Target, seq_len: int, tp: int = 1) -> dict[str, int]:
    """Bytes one layer keeps per token under each policy, averaged over the layers (device or host)."""
    out = {}
    for policy in ("none",) + GRAPH_POLICIES:
        if policy == "offload" and target.device_type == "cpu":
            continue
        s = _setup(base, target, Sharding("FSDP", target.count, 1, tp), policy, seq_len)
        m = tp_local(shape, tp)
        total = sum(n * layer_bytes_per_token(m, s, moe=moe, rope=rope, policy=policy) for moe, rope, n in m.layer_mix)
        out[policy] = round(total / shape.n_layers)
    return out


def plan_training(
    shape: ModelShape,
    counts,
    flops_per_token,
    target: Target,
    *,
    seq_len: int,
    kernels: TrainSetup,
    tp_plan: bool,
    efficiency: float = EFFICIENCY,
    min_seq: int = 128,
) -> Plan:
    """The plan (module docstring). `counts`: (total, active) parameters; `flops_per_token(seq)`:
    the model's training FLOPs per token at a sequence length; `kernels`: a TrainSetup whose loss /
    attention / moe / ce_chunk are the recipe's (the rest is planned here). When nothing fits at
    `seq_len`, the sequence is halved (down to `min_seq`) until something does, and a note says so."""
    if seq_len < 1:
        raise ConfigError(f"--seq {seq_len}: must be a positive number of tokens")
    seq = seq_len
    opts = options(shape, target, kernels, seq, tp_plan=tp_plan)
    asked = opts
    while not any(o.fits for o in opts) and seq // 2 >= min_seq:
        seq //= 2
        opts = options(shape, target, kernels, seq, tp_plan=tp_plan)
    if not any(o.fits for o in opts):
        seq, opts = seq_len, asked  # nothing fits at any length tried: show the one asked for
    total, active = counts
    fpt = flops_per_token(seq)
    inactive_frac = 6 * (total - active) / fpt if fpt else 0.0

    def dense(o: Option) -> bool:
        return bool(shape.moe_layers) and moe_kernel(kernels, target, o.policy) == "dense"

    def rank(o: Option):
        mfu = _mfu_of(o, dense_moe=dense(o), inactive_frac=inactive_frac)
        return mfu, o.batch * seq // o.sharding.tp, -opts.index(o)

    on_device = [o for o in opts if o.fits and o.policy != "offload"]
    offloaded = [o for o in opts if o.fits and o.policy == "offload"]
    chosen = max(on_device or offloaded, key=rank) if on_device or offloaded else None
    if on_device:
        offload = (False, f"an on-device option fits ({chosen.sharding.name}, memory policy {chosen.policy})")
    elif offloaded:
        offload = (
            True,
            "no on-device policy holds one sequence's activations; offload parks them in host memory "
            "between the forward and backward programs (graph_trainer.memory_policy = offload, "
            "graph_trainer.split = true)",
        )
    else:
        best = min((o for o in opts if o.policy == "offload"), key=lambda o: o.estimate.total, default=None)
        offload = (
            False,
            "not sufficient: nothing fits"
            + (
                f"; with activations offloaded a device still needs {format_bytes(best.estimate.total)} "
                f"(gathered weights {format_bytes(best.estimate.gathered_params)})"
                if best
                else ""
            ),
        )
    if chosen is None or chosen.policy == "none":
        scan = (False, "the eager step fits: it is not captured" if chosen else "nothing fits")
    elif len(shape.layer_mix) == 1:
        scan = (
            True,
            f"the captured step would trace {shape.n_layers} identical blocks; scan traces one "
            "(graph_trainer.scan_layers = true); the memory model counts no bytes for it",
        )
    else:
        scan = (False, "the blocks are not identical (layer kinds differ): scan cannot stack them")
    step = None
    if chosen is not None:
        step = predict_step(
            chosen, target, fpt, seq, inactive_params=total - active, dense_moe=dense(chosen), efficiency=efficiency
        )
    notes = [materialise_note(shape, target, opts[0].estimate.setup)] if opts else []
    notes = [n for n in notes if n] + [
        "predictions: memory from titan_core.memory.estimate, step time a roofline bound; communication not modelled",
    ]
    if seq != seq_len:
        notes.append(
            f"nothing fits at seq {seq_len} (options_at_seq_asked lists each option there); "
            f"planned at seq {seq}, the longest halving that fits"
        )
    if any(
        o.policy in GRAPH_POLICIES and not o.fits and o.estimate.gathered_params > target.budget // 2 for o in asked
    ):
        notes.append(
            "captured steps run SimpleFSDP, whose gathered bf16 copies of every weight stay alive through the step "
            "(titan_core's memory policy never recomputes a collective); that term decides which captured options fit"
        )
    if chosen is not None and shape.moe_layers and moe_kernel(kernels, target, chosen.policy) != kernels.moe:
        notes.append(
            f"kernels.moe = {moe_kernel(kernels, target, chosen.policy)}: a captured step needs static-shape "
            f"experts (an eager step's would be {kernels.moe}); verify it on the target"
        )
    tp = chosen.sharding.tp if chosen else 1
    return Plan(
        target=target, seq_len=seq, seq_len_asked=seq_len, params_total=total, params_active=active,
        flops_per_token=fpt, options=opts,
        activations_per_token_layer=activation_table(shape, kernels, target, seq, tp),
        chosen=chosen, offload=offload, scan=scan, step=step, notes=notes,
        asked_options=asked if seq != seq_len else [],
    )  # fmt: skip
