"""A plan for training a full-size model on a target: the layout (dp_shard, dp_replicate, tp, ep, cp,
pp), the memory policy, the batch, per-device memory and a step time with communication. Predictions,
not runs.

    target = parse_target("v7x:1024")
    plan = plan_training(shape, counts, fpt, target, seq_len=4096, kernels=setup, tp_plan=False)
    plan.chosen, plan.reasons, plan.would_fit, plan.to_dict()

The pieces, one job each:
- hardware.py: the one table of device kinds (memory, bf16 and float8 peaks, links, sources);
- plan/layout_memory.py: bytes per device of a layout (per-block gathers under FSDP2, experts over ep,
  vocab-sharded head under TP, the fused loss head, activations over cp, PP's stages and in-flight
  microbatches);
- plan/step_time.py: compute at calibrated efficiencies plus a term per collective, overlap stated;
- plan/search.py: the layouts tried, the choice, and why each degree has its value;
- plan/accept.py: titan_core's verdict on each candidate (the recipe it would write, checked by
  titan_core itself): a combination titan_core refuses is never chosen, and the plan says why;
- plan/published.py: the published runs the efficiencies come from.

The sequence asked for is never changed: when nothing fits at it, the plan has no chosen option and
`would_fit` says, in one line, what would (a shorter --seq, or more devices and the layout there;
fitting layouts titan_core refuses are counted, with its most frequent reason); `onboard plan` exits 1
with that line. Training is fp32 master weights and AdamW with bf16 compute.
Host offload with the graph splitter is chosen only when nothing on the device fits; scan is
recommended when the chosen step is captured and its blocks are identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from titan_core.config.loader import ConfigError
from titan_core.memory.activations import layer_bytes_per_token
from titan_core.memory.budget import GIB
from titan_core.memory.estimate import ModelShape, TrainSetup, format_bytes, tp_local

from onboard.sizing.plan.hardware import HARDWARE, KINDS, PER_HOST, Hardware
from onboard.sizing.plan import layout_memory as plan_memory
from onboard.sizing.plan.layout_memory import (
    Layout,
    MemSetup,
    device_memory,
    largest_batch,
)
from onboard.sizing.plan.search import (
    GLOBAL_TOKENS,
    GRAPH_POLICIES,
    Option,
    Space,
    choose,
    degree_reasons,
    ranked,
    refusal_summary,
    search,
    why_chosen,
)
from onboard.sizing.plan.step_time import Efficiency, StepInputs, StepPrediction, efficiency_for, predict_step

__all__ = ["GIB", "HEADROOM", "KINDS", "PER_HOST", "Plan", "Target", "parse_target", "plan_training"]

HEADROOM = 0.9
"""Fraction of a device's memory a plan fills: the rest is for what the estimate does not count
(the runtime's reservation, allocator fragmentation, kernel workspaces inside one op)."""
MORE_DEVICES = (2, 4, 8, 16)
"""Multiples of the target's count `would_fit` tries when nothing fits."""


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

    @property
    def hardware(self) -> Hardware | None:
        """The table's row (None for this CPU: communication is not modelled there)."""
        return HARDWARE.get(self.kind)

    @property
    def peak_fp8(self) -> float:
        return self.hardware.peak_fp8 if self.hardware else self.peak_flops


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
    hw = HARDWARE[kind]
    if count > hw.per_host and count % hw.per_host:
        raise ConfigError(f"--target '{spec}': {kind} comes {hw.per_host} per host; COUNT must be a multiple of it")
    what = f"HBM of one TPU {kind} chip (table)" if hw.device_type == "tpu" else f"HBM of one {kind.upper()} (table)"
    return Target(kind, count, hw.device_type, hw.memory_bytes, what, hw.peak_bf16, min(hw.per_host, count))


CAPTURED_MOE = {"cuda": "grouped_mm", "tpu": "tokamax", "cpu": "dense"}
"""The experts kernel a captured step runs when the recipe's is the host-syncing loop: routed and
static-shaped on accelerators (torch._grouped_mm in bf16; ragged_dot through the JAX bridge),
the dense one on a CPU. Not run here: a prediction, to verify on the target."""


def moe_kernel(base: TrainSetup, target: Target, mode: str) -> str:
    """The experts kernel a step of `mode` runs: a captured one (graph_trainer, scan) needs static shapes."""
    captured = mode in ("graph_trainer", "scan")
    return CAPTURED_MOE[target.device_type] if captured and base.moe == "loop" else base.moe


@dataclass
class Plan:
    target: Target
    seq_len: int
    params_total: int
    params_active: int
    flops_per_token: float
    options: list[Option]
    activations_per_token_layer: dict[str, int]
    """Per memory policy: bytes one layer keeps per token (layers averaged) on the chosen TP widths."""
    chosen: Option | None
    offload: tuple[bool, str]
    scan: tuple[bool, str]
    step: StepPrediction | None
    notes: list[str] = field(default_factory=list)
    why_chosen: str = ""
    """One sentence: why the chosen option won over the runner-up."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Per degree (tp, ep, cp, pp, dp_replicate): its chosen value and why."""
    would_fit: str | None = None
    """When nothing fits: one line saying what would (a shorter --seq, more devices, the layout there)."""
    shape: ModelShape | None = None
    """The model as the memory model split it."""

    @property
    def seq_len_asked(self) -> int:
        return self.seq_len  # the plan never changes the sequence asked for

    def ranked(self, limit: int = 20) -> list[Option]:
        """The fitting options titan_core accepts in the plan's order (plan_search.ranked), at most `limit`."""
        return ranked(self.options)[:limit]

    def batch_by_policy(self) -> dict[str, dict[str, int]]:
        """For the chosen layout and data-parallel kind: the most sequences per microbatch each mode's memory
        policies fit (0: not one), whether titan_core runs them or not (what checkpointing buys)."""
        c = self.chosen
        if c is None:
            return {}
        out: dict[str, dict[str, int]] = {}
        for o in self.options:
            if o.layout == c.layout and (o.data_parallel == c.data_parallel or o.captured):
                out.setdefault(o.mode, {})[o.policy] = o.largest_batch
        return out

    def to_dict(self) -> dict[str, Any]:
        t, hw = self.target, self.target.hardware
        c = self.chosen
        return {
            "target": {"kind": t.kind, "count": t.count, "device_type": t.device_type, "memory_bytes": t.memory_bytes,
                       "memory_source": t.memory_source, "budget_bytes": t.budget, "headroom": HEADROOM,
                       "peak_bf16_flops": t.peak_flops, "peak_fp8_flops": t.peak_fp8, "per_host": t.per_host,
                       "links": None if hw is None else {"scale_up_bytes_per_s": hw.scale_up_bw,
                                                         "scale_up_domain": hw.scale_up_domain,
                                                         "scale_out_bytes_per_s": hw.scale_out_bw,
                                                         "source": hw.source}},
            "seq_len": self.seq_len, "seq_len_asked": self.seq_len_asked,
            "params_total": self.params_total, "params_active": self.params_active,
            "flops_per_token": self.flops_per_token,
            "activations_per_token_per_layer": self.activations_per_token_layer,
            "options_tried": len(self.options), "options_fitting": sum(o.fits for o in self.options),
            "options_accepted": sum(o.usable for o in self.options),
            "refused": refusal_summary(self.options),
            "options": [o.to_dict() for o in self.ranked()],
            "chosen": c.to_dict() if c else None, "why_chosen": self.why_chosen,
            "largest_batch_by_policy": self.batch_by_policy(),
            "degrees": c.layout.degrees() if c else None,
            "degrees_why": self.reasons,
            "global_batch_tokens": c.layout.dp * c.batch * c.microbatches * self.seq_len if c else None,
            "offload_needed": self.offload[0], "offload_why": self.offload[1],
            "scan_needed": self.scan[0], "scan_why": self.scan[1],
            "prediction": self.step.to_dict() if self.step else None,
            "would_fit": self.would_fit,
            "notes": self.notes,
        }  # fmt: skip


def activation_table(ps: ModelShape, base: TrainSetup, target: Target, seq_len: int, tp: int = 1) -> dict[str, int]:
    """Bytes one layer keeps per token under each policy, averaged over the layers (device or host)."""
    m = tp_local(ps, tp)
    compute = "float32" if target.device_type == "cpu" else "bfloat16"
    out = {}
    for policy in ("none",) + GRAPH_POLICIES:
        if policy == "offload" and target.device_type == "cpu":
            continue
        s = replace(base, seq_len=seq_len, compute_dtype=compute, device_type=target.device_type,
                    moe=moe_kernel(base, target, "eager" if policy == "none" else "graph_trainer"))  # fmt: skip
        total = sum(n * layer_bytes_per_token(m, s, moe=moe, rope=rope, policy=policy) for moe, rope, n in m.layer_mix)
        out[policy] = round(total / ps.n_layers)
    return out


def plan_training(
    shape: ModelShape | ModelShape,
    counts,
    flops_per_token: Callable[[int], float],
    target: Target,
    *,
    seq_len: int,
    kernels: TrainSetup,
    tp_plan: bool,
    efficiency: float | Efficiency | None = None,
    compiled: bool = True,
    captured_compiled: bool | None = None,
    float8: bool = False,
    min_seq: int = 128,
    accept: Callable[[Option], str | None] | None = None,
) -> Plan:
    """The plan (module docstring). `shape`: the model (a ModelShape counts its experts exactly; a
    ModelShape's are derived from its widths); `counts`: (total, active) parameters; `flops_per_token(seq)`:
    the model's training FLOPs per token; `kernels`: a TrainSetup whose loss / attention / moe / ce_chunk
    are the recipe's; `compiled`: the eager step is compiled per block; `captured_compiled`: the Graph
    Trainer's captured step is compiled with inductor (None: as `compiled`); `float8`:
    the recipe trains its linear layers in float8; `efficiency` replaces the calibrated compute efficiency
    (an Efficiency: every constant, as plan_published.derive_constants tries them); `accept(option)`:
    titan_core's refusal of the recipe an option would write, None when it runs (plan_accept.Acceptance;
    without it every fitting option counts as accepted)."""
    if seq_len < 1:
        raise ConfigError(f"--seq {seq_len}: must be a positive number of tokens")
    ps = shape
    total, active = counts
    space = Space(tp_plan=tp_plan, ep=ps.is_moe)
    eff = efficiency if isinstance(efficiency, Efficiency) else efficiency_for(target.device_type, efficiency)
    fpt = _cached(flops_per_token)

    def run(t: Target, seq: int) -> list[Option]:
        def step_of(o: Option) -> StepPrediction:
            inductor = compiled if captured_compiled is None else captured_compiled
            return _predict(ps, counts, fpt, t, o, seq_len=seq, kernels=kernels, captured_compiled=inductor,
                            float8=float8, eff=eff)  # fmt: skip

        return search(ps, t, kernels, seq_len=seq, space=space, moe_kernel=lambda m: moe_kernel(kernels, t, m),
                      step_of=step_of, compiled=compiled, accept=accept)  # fmt: skip

    opts = run(target, seq_len)
    chosen = choose(opts)
    offload, scan = offload_of(chosen), scan_of(ps, chosen, opts)
    notes = []
    notes.append("predictions: memory from onboard/sizing/plan/layout_memory.py (titan_core's activation arithmetic), step "
                 "time from plan/step_time.py: compute at efficiencies calibrated on published runs plus a term per "
                 "collective over the target's links (hardware.py)")  # fmt: skip
    reasons: dict[str, str] = {}
    would, why = None, ""
    if chosen is not None:
        reasons = degree_reasons(opts, chosen, ps, space)
        why = why_chosen(opts, chosen)
        notes += _choice_notes(ps, kernels, target, chosen, seq_len)
    else:
        would = would_fit(opts, target, seq_len, min_seq, run)
    tp = chosen.layout.tp if chosen else 1
    return Plan(
        target=target, seq_len=seq_len, params_total=total, params_active=active, flops_per_token=fpt(seq_len),
        options=opts, activations_per_token_layer=activation_table(ps, kernels, target, seq_len, tp),
        chosen=chosen, offload=offload, scan=scan, step=chosen.step if chosen else None, notes=notes,
        why_chosen=why, reasons=reasons, would_fit=would, shape=ps,
    )  # fmt: skip


def offload_of(chosen: Option | None) -> tuple[bool, str]:
    """(whether the option parks activations on the host, why): graph_trainer.split in its recipe."""
    if chosen is None:
        return False, "not sufficient: nothing fits"
    if chosen.policy != "offload":
        return False, f"an on-device option fits ({chosen.layout.name}, memory policy {chosen.policy})"
    return True, ("no on-device policy holds one sequence's activations; offload parks them in host memory between "
                  "the forward and backward programs (graph_trainer.memory_policy = offload, graph_trainer.split = "
                  "true)")  # fmt: skip


def scan_of(ps: ModelShape, chosen: Option | None, opts: list[Option] = ()) -> tuple[bool, str]:
    """(whether the chosen option's captured step scans over its layers, why): graph_trainer.scan_layers."""
    if chosen is None or not chosen.captured:
        return False, "the chosen step is not captured" if chosen else "nothing fits"
    if chosen.scan:
        return True, (f"the captured step traces one of its {ps.n_layers} identical blocks and loops it "
                      "(graph_trainer.scan_layers = true); the memory model counts no bytes for it")  # fmt: skip
    if len(ps.layer_mix) > 1:
        return False, "the blocks are not identical (layer kinds differ): scan cannot stack them"
    same = [o for o in opts if o.scan and o.layout == chosen.layout and o.policy == chosen.policy and o.fits]
    if same and same[0].refused:
        return False, f"titan_core refuses scan for this model: {same[0].refused}"
    return False, "the unrolled captured step ranked first"


def _cached(flops_per_token: Callable[[int], float]) -> Callable[[int], float]:
    seen: dict[int, float] = {}

    def fpt(s: int) -> float:
        if s not in seen:
            seen[s] = float(flops_per_token(s))
        return seen[s]

    return fpt


def recompute_bytes(ps: ModelShape, lay: Layout, setup) -> float:
    """Bytes per token, over one rank's layers on its TP widths, of what the eager step saves and the option's
    memory policy does not keep (its backward makes them again): 0 for policy none."""
    if setup.policy == "none":
        return 0.0
    m = tp_local(ps, lay.tp)
    kept = "default" if setup.policy == "offload" else setup.policy
    t = TrainSetup(batch_size=1, seq_len=max(1, setup.seq_len // lay.cp), compute_dtype=setup.compute_dtype,
                   attention=setup.attention, moe=setup.moe, device_type=setup.device_type)  # fmt: skip
    scale = plan_memory.stage_layers(ps, lay.pp) / ps.n_layers
    return scale * sum(n * (layer_bytes_per_token(m, t, moe=moe, rope=rope, policy="none")
                            - layer_bytes_per_token(m, t, moe=moe, rope=rope, policy=kept))
                       for moe, rope, n in m.layer_mix)  # fmt: skip


def _predict(ps: ModelShape, counts, fpt, target: Target, o: Option, *, seq_len: int, kernels: TrainSetup,
             captured_compiled: bool, float8: bool, eff: Efficiency) -> StepPrediction:  # fmt: skip
    total, active = counts
    moe = moe_kernel(kernels, target, o.mode)
    x = StepInputs(batch=o.batch, microbatches=o.microbatches, seq_len=seq_len, policy=o.policy,
                   data_parallel=o.data_parallel, flops_per_token=fpt(seq_len),
                   attention_flops_per_token=max(0.0, fpt(seq_len) - fpt(0)), inactive_params=total - active,
                   dense_moe=ps.is_moe and moe == "dense", mode=o.mode, captured_compiled=captured_compiled,
                   float8=float8, recompute_bytes_per_token=recompute_bytes(ps, o.layout, o.setup))  # fmt: skip
    return predict_step(ps, o.layout, x, peak_bf16=target.peak_flops, peak_fp8=target.peak_fp8, hw=target.hardware,
                        eff=eff)  # fmt: skip


def predict_layout(ps: ModelShape, counts, flops_per_token: Callable[[int], float], target: Target, layout: Layout, *,
                   seq_len: int, kernels: TrainSetup, batch: int, policy: str, microbatches: int = 1,
                   data_parallel: str | None = None, mode: str | None = None, compiled: bool = True,
                   float8: bool = False, eff: Efficiency | None = None) -> Option:  # fmt: skip
    """One given layout at a given batch (a published run's), its memory and predicted step: what
    `bench/plan_vs_published.py` sets beside the published figure. `mode` (None: per-block compile or eager as
    `compiled` says for policy none, else the Graph Trainer); `compiled` also says whether a captured step is
    compiled by inductor. `option.largest_batch` says whether it fits."""
    eff = eff or efficiency_for(target.device_type)
    mode = mode or (("compile" if compiled else "eager") if policy == "none" else "graph_trainer")
    dp_kind = data_parallel or ("fsdp2" if mode in ("eager", "compile") and layout.tp == 1 else "simple_fsdp")
    setup = MemSetup(policy=policy, data_parallel=dp_kind, seq_len=seq_len, grad_accum=microbatches,
                     compute_dtype="float32" if target.device_type == "cpu" else "bfloat16", loss=kernels.loss,
                     ce_chunk=kernels.ce_chunk, attention=kernels.attention, moe=moe_kernel(kernels, target, mode),
                     device_type=target.device_type,
                     mode="graph_trainer" if mode == "scan" else mode)  # fmt: skip
    fit, _ = largest_batch(ps, layout, setup, target.budget)
    o = Option(layout, policy, dp_kind, batch, fit, microbatches, device_memory(ps, layout, setup, batch=batch), setup,
               mode=mode, budget=target.budget)  # fmt: skip
    o.step = _predict(ps, counts, _cached(flops_per_token), target, o, seq_len=seq_len, kernels=kernels,
                      captured_compiled=compiled, float8=float8, eff=eff)  # fmt: skip
    return o


def _choice_notes(ps: ModelShape, kernels: TrainSetup, target: Target, chosen: Option, seq_len: int) -> list[str]:
    notes = []
    lay = chosen.layout
    if chosen.batch < chosen.largest_batch:
        notes.append(f"batch {chosen.batch} of the {chosen.largest_batch} that fit: the global batch stays within "
                     f"{GLOBAL_TOKENS:,} tokens ({lay.dp} data-parallel ranks x {chosen.microbatches} microbatches x "
                     f"seq {seq_len})")  # fmt: skip
    if chosen.data_parallel == "simple_fsdp":
        notes.append("SimpleFSDP keeps every gathered bf16 weight through the backward (autograd saves it; the "
                     "captured step never recomputes a collective): the memory model counts them all; an eager step "
                     "may gather them again instead (parallelism.reshard_after_forward: the plan's "
                     "simple_fsdp_reshard)")
    if ps.is_moe and moe_kernel(kernels, target, chosen.mode) != kernels.moe:
        notes.append(f"kernels.moe = {moe_kernel(kernels, target, chosen.mode)}: a captured step needs static-shape "
                     f"experts (an eager step's would be {kernels.moe}); verify it on the target")  # fmt: skip
    notes.append("`onboard plan --check` runs this recipe's layout here: each degree above 1 at 2 on gloo processes, "
                 "its mode and memory policy, its sequence and batch where they fit, on the twin")
    return notes


def would_fit(opts: list[Option], target: Target, seq_len: int, min_seq: int, run) -> str:
    """One line: what fits when nothing does at `seq_len` on `target` (a shorter --seq here, or more devices
    at this --seq, with the layout that fits there)."""
    refused = refusal_summary(opts)
    if refused["options"]:  # layouts fit, but titan_core runs none of them as the recipe would have it
        top = refused["reasons"][0]
        head = (f"nothing titan_core accepts fits --seq {seq_len} on {target.count} x {target.kind}: "
                f"{refused['options']} fitting option(s) are refused, most often ({top['count']}, e.g. "
                f"{top['fastest']}) with: {top['reason']}")  # fmt: skip
    else:
        smallest = min(opts, key=lambda o: o.estimate.total)
        head = (f"nothing fits --seq {seq_len} on {target.count} x {target.kind}: the smallest peak is "
                f"{format_bytes(smallest.estimate.total)} ({smallest.label}, batch 1) "
                f"over the {format_bytes(target.budget)} a device has")  # fmt: skip
    hints = []
    seq = seq_len // 2
    while seq >= min_seq:
        got = choose(run(target, seq))
        if got is not None:
            hints.append(f"--seq {seq} fits here ({got.label}, batch {got.batch})")
            break
        seq //= 2
    for k in MORE_DEVICES:
        count = target.count * k
        host = PER_HOST.get(target.kind, count)  # a CPU target's processes share this one host
        if count > host and count % host:
            continue
        more = replace(target, count=count, per_host=min(host, count))
        got = choose(run(more, seq_len))
        if got is not None:
            hints.append(f"--target {target.kind}:{count} fits --seq {seq_len} ({got.layout.name}, "
                         f"{got.mode}, {got.memory_label}, batch {got.batch})")  # fmt: skip
            break
    if not hints:
        most = target.count * MORE_DEVICES[-1]
        return head + f"; nor does --seq {min_seq} here, nor --seq {seq_len} on {most} devices"
    return head + "; " + ", or ".join(hints)
