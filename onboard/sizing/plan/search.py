"""The search over (dp_shard, dp_replicate, tp, ep, cp, pp) x memory policy for one target, and why
the chosen degrees won.

    opts = search(ps, target, kernels, seq_len=4096, space=Space(...), step_of=...)
    chosen = choose(opts); why = degree_reasons(opts, chosen, ps, space)

Which degrees are tried:
- tp: 1, and powers of two up to one host's devices where the family has a TP plan and the head
  counts and MLP width divide (TP's all-reduces stay on the host's fast links);
- cp: 1, and powers of two up to MAX_CP whose 2 x cp load-balanced chunks divide the sequence and
  leave at least MIN_CP_CHUNK tokens per rank;
- pp: 1, and powers of two up to MAX_PP leaving at least 2 layers per stage, with 1F1B and
  interleaved1F1B (GPipe holds every microbatch's activations for the same bubble, so it never wins
  here; the recipe may still name it); only eager steps (a captured step is one program, a pipeline
  schedule is not);
- dp_replicate: 1, and powers of two leaving dp_shard >= 1 (HSDP: the shard group's collectives stay
  inside a host, the replicas all-reduce once per step);
- ep (MoE only): 1, and powers of two dividing both dp_shard x cp and the expert count;
- execution mode and memory policy: the eager step (FSDP2 or SimpleFSDP without TP, SimpleFSDP with it),
  also compiled per block when the recipe's step is, each with activation checkpointing none, selective
  op (`default`: the matmul outputs kept) or full; and the Graph Trainer's captured step with its
  default / full / offload policy (SimpleFSDP; offload not on a CPU), also scanned over its layers where
  they are identical. Each mode is priced at its own efficiency (plan/step_time.py).

Each fitting option is then judged by titan_core (`accept`: the recipe the plan would write for it,
through titan_core.parallel.check_parallelism and the model-level checks; onboard/sizing/plan/accept.py):
a refused option keeps titan_core's one-line reason and is never chosen.

Every layout is given the largest batch that fits, at most what keeps the global batch within
GLOBAL_TOKENS; under PP the microbatches are PP_MICROBATCHES x pp. The options titan_core accepts are
ranked by predicted step time (tokens/s per device); within TIE of each other by memory headroom (the
fraction of the budget left), then the simpler layout. `why_chosen` says in a sentence why the winner won
over the runner-up. Offload is chosen only when nothing fits on the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from titan_core.memory.estimate import ModelShape, TrainSetup

from onboard.sizing.plan.layout_memory import (
    REGATHERING,
    DeviceMemory,
    Layout,
    MemSetup,
    device_memory,
    largest_batch,
    stage_layers,
)
from onboard.sizing.plan.step_time import StepPrediction

GRAPH_POLICIES = ("default", "full", "offload")
EAGER_POLICIES = ("none", "default", "full")
"""Activation checkpointing of an eager or per-block compiled step: none, selective op (the saved set of the
Graph Trainer's `default`), full (block inputs only)."""
POLICY_ORDER = ("none",) + GRAPH_POLICIES
AC_NAMES = {"none": "no activation checkpointing", "default": "selective-op activation checkpointing",
            "full": "full activation checkpointing"}
MAX_CP = 16
MIN_CP_CHUNK = 256
MAX_PP = 16
PP_MICROBATCHES = 4
"""Microbatches per pipeline stage: the 1F1B bubble is (pp - 1) / (4 pp + pp - 1), under 20%."""
GLOBAL_TOKENS = 16 * 2**20
"""Largest global batch a plan gives, in tokens: Llama 3 405B's pre-training batch reached 16M tokens
(Llama 3 paper, section 3.4); beyond it a larger per-device batch buys speed with optimisation."""
TIE = 0.02
"""Options within this fraction of each other's predicted tokens/s tie: memory headroom decides, then the
simpler layout (the fitted published rows agree with their predictions to within it)."""
DEGREES = ("tp", "ep", "cp", "pp", "dp_replicate")
DP_ORDER = ("fsdp2", "simple_fsdp", REGATHERING)
"""Preferred in this order among close options: FSDP2 for an eager step, SimpleFSDP keeping its gathered
weights, SimpleFSDP gathering them again in the backward (parallelism.reshard_after_forward: more traffic)."""
PARALLEL = ("tp", "ep", "cp", "pp")


@dataclass(frozen=True)
class Space:
    """What the model and the family allow."""

    tp_plan: bool
    """The family has a tensor-parallel plan."""
    ep: bool = True
    """Experts may be split (a MoE model)."""
    cp: bool = True
    pp: bool = True


@dataclass
class Option:
    layout: Layout
    policy: str
    """What the step saves: none | default | full | offload (the Graph Trainer's policy, or the eager step's
    activation checkpointing: default = selective op, full = full)."""
    data_parallel: str
    batch: int
    """Sequences per microbatch per data-parallel rank the plan runs (0: not even one fits)."""
    largest_batch: int
    """The largest that fits (>= batch: the global batch caps the planned one)."""
    microbatches: int
    estimate: DeviceMemory
    """At `batch` (at batch 1 when none fits)."""
    setup: MemSetup | None = None
    """How it trains, for the memory model (device_memory(shape, layout, setup, batch=...))."""
    step: StepPrediction | None = None
    mode: str = "eager"
    """eager | compile (per block) | graph_trainer | scan (the captured step scanned over its layers)."""
    refused: str | None = None
    """titan_core's one-line refusal of the recipe this option would write (None: accepted, or not judged
    because it does not fit)."""
    budget: int = 0
    """The device's budget the option was fitted to (for its headroom)."""

    @property
    def usable(self) -> bool:
        """It fits and titan_core runs it: the only options a plan may choose."""
        return self.fits and self.refused is None

    @property
    def captured(self) -> bool:
        """A Graph Trainer step (unrolled or scanned)."""
        return self.mode in ("graph_trainer", "scan")

    @property
    def compile(self) -> bool:
        return self.mode == "compile"

    @property
    def scan(self) -> bool:
        return self.mode == "scan"

    @property
    def headroom(self) -> float:
        """The fraction of the budget left at the planned batch."""
        return 1 - self.estimate.total / self.budget if self.budget else 0.0

    @property
    def memory_label(self) -> str:
        if self.captured:
            return f"policy {self.policy}"
        return AC_NAMES[self.policy]

    @property
    def label(self) -> str:
        """Layout, mode and memory policy in a few words (how reasons name an option)."""
        return f"{self.layout.name}, {self.data_parallel}, {self.mode}, {self.memory_label}"

    @property
    def sharding(self) -> Layout:
        return self.layout

    @property
    def fits(self) -> bool:
        return self.batch > 0

    @property
    def tokens_per_s(self) -> float:
        return self.step.tokens_per_s_device if self.step else 0.0

    @property
    def complexity(self) -> int:
        return sum(getattr(self.layout, d) > 1 for d in DEGREES)

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "sharding": self.layout.name, "degrees": self.layout.degrees(), "policy": self.policy, "mode": self.mode,
            "activation_checkpoint": None if self.captured else {"none": "none", "default": "selective op",
                                                                 "full": "full"}[self.policy],
            "data_parallel": self.data_parallel, "batch": self.batch, "largest_batch": self.largest_batch,
            "grad_accum": self.microbatches, "peak_bytes": e.total, "peak_at": e.phase, "params_bytes": e.params,
            "grads_bytes": e.grads, "optimizer_bytes": e.optimizer_state, "gathered_params_bytes": e.gathered_params,
            "activations_bytes": e.activations, "activations_host_bytes": e.activations_host,
            "workspace_bytes": max(e.backward_workspace, e.optimizer_workspace), "headroom": self.headroom,
            "predicted_tokens_per_s_device": self.tokens_per_s, "predicted_mfu": self.step.mfu if self.step else None,
            "predicted_step_s": self.step.step_time_s if self.step else None,
            "exposed_comm_s": self.step.exposed_s if self.step else None, "refused": self.refused,
        }  # fmt: skip


def _pow2(limit: int) -> list[int]:
    out, v = [], 2
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def layouts(ps: ModelShape, target, seq_len: int, space: Space) -> list[Layout]:
    """Every layout of the target's devices the module docstring allows."""
    n, base = target.count, ps
    tps = [1] + [t for t in _pow2(target.per_host) if space.tp_plan and n % t == 0
                 and all(w % t == 0 for w in (base.n_heads, base.n_kv_heads, base.ffn_hidden_dim))]  # fmt: skip
    cps = [1] + [c for c in _pow2(MAX_CP) if space.cp and seq_len % (2 * c) == 0 and seq_len // c >= MIN_CP_CHUNK]
    pps = [1] + [p for p in _pow2(MAX_PP) if space.pp and ps.n_layers >= 2 * p]
    out: list[Layout] = []
    for tp in tps:
        for cp in cps:
            for pp in pps:
                if n % (tp * cp * pp):
                    continue
                dp = n // (tp * cp * pp)
                for rep in [1] + [r for r in _pow2(dp) if dp % r == 0]:
                    shard = dp // rep
                    eps = [1] + [e for e in _pow2(base.n_experts) if space.ep and ps.is_moe and (shard * cp) % e == 0
                                 and base.n_experts % e == 0]  # fmt: skip
                    for ep in eps:
                        schedules = ("1F1B",) if pp == 1 else ("1F1B", "interleaved1F1B")
                        for sched in schedules:
                            if sched == "interleaved1F1B" and ps.n_layers < 2 * 2 * pp:
                                continue
                            out.append(Layout(shard, rep, tp, ep, cp, pp, sched))
    return out


def microbatches(lay: Layout, dp_tokens_per_seq: int) -> int:
    """Microbatches a step runs: 1 without PP; PP_MICROBATCHES per stage, fewer when the global batch would
    pass GLOBAL_TOKENS at one sequence each (never fewer than the stages)."""
    if lay.pp == 1:
        return 1
    want = PP_MICROBATCHES * lay.pp
    return max(lay.pp, min(want, GLOBAL_TOKENS // max(1, dp_tokens_per_seq)))


def modes_of(lay: Layout, compiled: bool, scannable: bool) -> list[tuple[str, tuple[str, ...]]]:
    """(mode, its memory policies) a layout is tried in: eager (and per-block compile when the recipe compiles)
    with each activation-checkpointing policy; outside a pipeline the Graph Trainer's policies, also scanned
    where the blocks are identical (a captured step is one program, a pipeline schedule is not)."""
    out = [("eager", EAGER_POLICIES)] + ([("compile", EAGER_POLICIES)] if compiled else [])
    if lay.pp == 1:
        out.append(("graph_trainer", GRAPH_POLICIES))
        if scannable:
            out.append(("scan", GRAPH_POLICIES))
    return out


def search(ps: ModelShape, target, kernels: TrainSetup, *, seq_len: int, space: Space,
           moe_kernel: Callable[[str], str], step_of: Callable[[Option], StepPrediction],
           compiled: bool = False, accept: Callable[[Option], str | None] | None = None) -> list[Option]:  # fmt: skip
    """Every layout in every mode with every memory policy and data-parallel kind that applies (module
    docstring), each with its batch, memory and, when it fits, its predicted step (`step_of`) and
    titan_core's verdict (`accept(option)`: its refusal, None when it runs). `moe_kernel(mode)`: the
    experts kernel it runs; `compiled`: the recipe compiles its eager step per block."""
    compute = "float32" if target.device_type == "cpu" else "bfloat16"
    scannable = len(ps.layer_mix) == 1
    out: list[Option] = []
    for lay in layouts(ps, target, seq_len, space):
        micro = microbatches(lay, lay.dp * seq_len)
        fitted: dict[tuple, tuple] = {}
        for mode, policies in modes_of(lay, compiled, scannable):
            for policy in policies:
                if policy == "offload" and target.device_type == "cpu":
                    continue  # on a CPU the host is the device
                for dp_kind in dp_kinds(lay, mode):
                    mem_mode = "graph_trainer" if mode == "scan" else mode
                    setup = MemSetup(policy=policy, data_parallel=dp_kind, seq_len=seq_len, grad_accum=micro,
                                     compute_dtype=compute, loss=kernels.loss, ce_chunk=kernels.ce_chunk,
                                     attention=kernels.attention, moe=moe_kernel(mode),
                                     device_type=target.device_type, mode=mem_mode)  # fmt: skip
                    if setup not in fitted:  # scan holds what the unrolled step does
                        fit, est = largest_batch(ps, lay, setup, target.budget)
                        cap = max(1, GLOBAL_TOKENS // (lay.dp * seq_len * micro))
                        batch = min(fit, cap)
                        if batch and batch != fit:
                            est = device_memory(ps, lay, setup, batch=batch)
                        fitted[setup] = (batch, fit, est)
                    batch, fit, est = fitted[setup]
                    opt = Option(lay, policy, dp_kind, batch, fit, micro, est, setup, mode=mode, budget=target.budget)
                    if opt.fits:
                        opt.step = step_of(opt)
                        opt.refused = accept(opt) if accept is not None else None
                    out.append(opt)
    return out


def dp_kinds(lay: Layout, mode: str) -> tuple[str, ...]:
    """The data-parallel kinds a layout runs in a mode: FSDP2 only eager or compiled per block, without TP;
    SimpleFSDP's re-gathering only outside a pipeline (a stage keeps its weights gathered across its
    microbatches); SimpleFSDP keeping its gathered weights always. titan_core judges the rest."""
    if mode in ("graph_trainer", "scan"):
        return ("simple_fsdp",)
    kinds = DP_ORDER if lay.tp == 1 else ("simple_fsdp", REGATHERING)
    return tuple(k for k in kinds if k != REGATHERING or lay.pp == 1)


MODE_ORDER = ("compile", "eager", "scan", "graph_trainer")
"""Among tied options: the per-block compiled step, the eager one, then the captured step (scanned first)."""


def preference(o: Option) -> tuple:
    """Among options that tie on predicted speed (within TIE): the most memory headroom, then the simplest
    layout, the milder memory policy, the mode, FSDP2 for an eager step, then speed."""
    return (-round(o.headroom, 2), o.complexity, POLICY_ORDER.index(o.policy), MODE_ORDER.index(o.mode),
            DP_ORDER.index(o.data_parallel), -o.tokens_per_s)  # fmt: skip


def ranked(opts: list[Option]) -> list[Option]:
    """The options titan_core accepts that fit, best first: on the device before host offload, then by predicted
    tokens/s, options within TIE of the one above them ordered by `preference`."""
    pool = [o for o in opts if o.usable]
    on_device = sorted((o for o in pool if o.policy != "offload"), key=lambda o: -o.tokens_per_s)
    offload = sorted((o for o in pool if o.policy == "offload"), key=lambda o: -o.tokens_per_s)
    out: list[Option] = []
    for group in (on_device, offload):
        i = 0
        while i < len(group):
            top, end = group[i].tokens_per_s, i + 1
            while end < len(group) and group[end].tokens_per_s >= top * (1 - TIE):
                end += 1  # the group is sorted by speed: the options tying with `top` are the ones right after it
            out += sorted(group[i:end], key=preference)
            i = end
    return out


def choose(opts: list[Option]) -> Option | None:
    """The first of `ranked`: the most predicted tokens/s on the device among the options titan_core accepts
    (offload only when nothing else fits); a tie goes to memory headroom, then the simpler layout."""
    order = ranked(opts)
    return order[0] if order else None


def why_chosen(opts: list[Option], chosen: Option) -> str:
    """One sentence: why `chosen` won over the runner-up (the next option that differs in layout, mode, policy
    or data-parallel kind), in the terms the prediction is made of."""
    order = [o for o in ranked(opts) if o is not chosen and (o.layout, o.mode, o.policy, o.data_parallel) !=
             (chosen.layout, chosen.mode, chosen.policy, chosen.data_parallel)]  # fmt: skip
    if not order:
        return f"{chosen.label}, batch {chosen.batch}: the only option that fits and titan_core runs"
    r, c = order[0], chosen
    head = (f"{c.label}, batch {c.batch}, predicts {c.tokens_per_s:,.0f} tokens/s per device against "
            f"{r.tokens_per_s:,.0f} for the runner-up ({r.label}, batch {r.batch})")  # fmt: skip
    if c.tokens_per_s < r.tokens_per_s * (1 + TIE) and r.tokens_per_s < c.tokens_per_s * (1 + TIE):
        if round(c.headroom, 2) != round(r.headroom, 2):
            return head + (f": a tie within {TIE:.0%}, decided by memory headroom, {c.headroom:.0%} of the "
                           f"budget left against {r.headroom:.0%}")  # fmt: skip
        return head + f": a tie within {TIE:.0%} and in headroom, decided by the simpler layout, policy and mode"
    cs, rs = c.step, r.step
    causes = []
    if abs(cs.efficiency - rs.efficiency) > 1e-9:
        causes.append(f"compute at {cs.efficiency:.3g} of peak against {rs.efficiency:.3g} ({c.mode} vs {r.mode})")
    if abs(cs.recompute_s / cs.tokens_per_device - rs.recompute_s / rs.tokens_per_device) > 1e-12 or \
            c.policy != r.policy:
        causes.append(f"{c.memory_label} against {r.memory_label} ({cs.compute_s / cs.tokens_per_device * 1e6:.3g} "
                      f"vs {rs.compute_s / rs.tokens_per_device * 1e6:.3g} us of compute per token)")
    ce, re_ = cs.exposed_s / cs.tokens_per_device, rs.exposed_s / rs.tokens_per_device
    if abs(ce - re_) > 1e-12:
        causes.append(f"{cs.exposed_s:.3g} s of exposed communication per step against {rs.exposed_s:.3g} "
                      f"({ce * 1e6:.3g} vs {re_ * 1e6:.3g} us per token)")
    if cs.bubble != rs.bubble:
        causes.append(f"a pipeline bubble of x{cs.bubble:.3g} against x{rs.bubble:.3g}")
    why = "; ".join(causes) or "the same compute and communication per token at another batch"
    return head + f", {c.tokens_per_s / r.tokens_per_s - 1:+.1%}: " + why


def refusal_summary(opts: list[Option], limit: int = 8) -> dict[str, Any]:
    """The fitting options titan_core refused, grouped by its one-line reason (most frequent first): each
    reason's count, the fastest option it refused and up to `limit` of the layouts (with mode and policy)."""
    groups: dict[str, list[Option]] = {}
    for o in opts:
        if o.fits and o.refused is not None:
            groups.setdefault(o.refused, []).append(o)
    reasons = []
    for why, group in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        group.sort(key=lambda o: -o.tokens_per_s)
        labels = list(dict.fromkeys(o.label for o in group))
        reasons.append({"reason": why, "count": len(group), "fastest": group[0].label,
                        "fastest_predicted_tokens_per_s_device": group[0].tokens_per_s,
                        "layouts": labels[:limit], "more_layouts": max(0, len(labels) - limit)})  # fmt: skip
    return {"options": sum(len(g) for g in groups.values()), "reasons": reasons}


def degree_reasons(opts: list[Option], chosen: Option, ps: ModelShape, space: Space) -> dict[str, str]:
    """Per degree (tp, ep, cp, pp, dp_replicate): the value chosen and why, against the best fitting
    option titan_core accepts with another value of that degree; and when a faster fitting one with
    another value was refused, titan_core's reason."""
    lay, out = chosen.layout, {}
    facts = {
        "tp": f"{ps.n_heads // lay.tp} of {ps.n_heads} query heads per rank" if lay.tp > 1 else "",
        "ep": f"{ps.n_experts // lay.ep} of {ps.n_experts} experts per rank per layer, each sharded over "
              f"{lay.edp} ranks" if lay.ep > 1 else "",
        "cp": f"each sequence in {2 * lay.cp} load-balanced chunks, two per rank" if lay.cp > 1 else "",
        "pp": f"{stage_layers(ps, lay.pp)} layers per stage, {chosen.microbatches} microbatches, bubble "
              f"x{chosen.step.bubble:.2f}" if lay.pp > 1 and chosen.step else "",
        "dp_replicate": f"shard groups of {lay.dp_shard * lay.cp}, replicated {lay.dp_replicate} times"
                        if lay.dp_replicate > 1 else "",
    }  # fmt: skip
    for d in DEGREES:
        value = getattr(lay, d)
        if d == "tp" and not space.tp_plan:
            out[d] = f"tp {value}: the family has no tensor-parallel plan"
            continue
        if d == "ep" and not ps.is_moe:
            out[d] = f"ep {value}: a dense model has no experts"
            continue
        others = [o for o in opts if o.usable and o.policy != "offload" and getattr(o.layout, d) != value]
        head = f"{d} {value}" + (f" ({facts[d]})" if facts[d] else "")
        refused = _refused_clause(opts, d, value, chosen, max((o.tokens_per_s for o in others), default=0.0))
        if not others:
            tried = sorted({getattr(o.layout, d) for o in opts if getattr(o.layout, d) != value})
            fitting = sorted({getattr(o.layout, d) for o in opts if o.fits and getattr(o.layout, d) != value})
            if fitting:
                why = f": every fitting layout with {d} in {fitting} is refused by titan_core" + refused
            elif tried:
                why = f": no layout with {d} in {tried} fits"
            else:
                why = f": the only {d} this target allows"
            out[d] = head + why
            continue
        alt = max(others, key=lambda o: o.tokens_per_s)
        ratio = chosen.tokens_per_s / alt.tokens_per_s if alt.tokens_per_s else math.inf
        other = f"{d} {getattr(alt.layout, d)} ({alt.label}, batch {alt.batch})"
        if ratio < 1:
            why = (f"the best with {other} predicts {1 / ratio:.3f}x its tokens/s, a tie within {TIE:.0%}: "
                   "memory headroom, then the simpler layout, decided")  # fmt: skip
        else:
            why = f"predicted {ratio:.2f}x the tokens/s of the best with {other}"
        ones = [o for o in others if getattr(o.layout, d) == 1]
        if value > 1 and not ones:
            refused_ones = [o for o in opts if o.fits and o.refused and getattr(o.layout, d) == 1]
            if refused_ones:
                top = max(refused_ones, key=lambda o: o.tokens_per_s)
                why += (f"; every fitting layout with {d} 1 is refused by titan_core (the fastest, {top.label}: "
                        f"{top.refused})")  # fmt: skip
            else:
                why += f"; no layout with {d} 1 fits"
        elif value > 1 and getattr(alt.layout, d) != 1:
            one = max(ones, key=lambda o: o.tokens_per_s)
            why += (f"; the best with {d} 1 ({one.label}) predicts "
                    f"{one.tokens_per_s / chosen.tokens_per_s:.2f}x its tokens/s")  # fmt: skip
        out[d] = f"{head}: {why}{refused}"
    return out


def _refused_clause(opts: list[Option], d: str, value: int, chosen: Option, best_accepted: float) -> str:
    """'; titan_core refuses the fastest with <d> <v> (...): <its reasons>' when a fitting option with another
    value of `d`, faster than every accepted one with another value, was refused; else ''. The option named
    is the fastest of those with `d` the only degree above 1 among tp / ep / cp / pp when there is one (why
    `d` itself is refused with this recipe), and its reasons are those of its layout in every mode refused."""
    refused = [o for o in opts if o.fits and o.refused and o.policy != "offload" and getattr(o.layout, d) != value]
    faster = [o for o in refused if o.tokens_per_s > best_accepted]
    if not faster:
        return ""
    alone = [o for o in faster if all(getattr(o.layout, x) == 1 for x in PARALLEL if x != d)] or faster
    top = max(alone, key=lambda o: o.tokens_per_s)
    same = sorted((o for o in refused if o.layout == top.layout), key=lambda o: -o.tokens_per_s)
    reasons = list(dict.fromkeys(o.refused for o in same))[:3]
    ratio = top.tokens_per_s / chosen.tokens_per_s if chosen.tokens_per_s else math.inf
    return (f"; titan_core refuses the fastest with {d} {getattr(top.layout, d)} ({top.layout.name}, predicted "
            f"{ratio:.2f}x the chosen tokens/s): " + "; ".join(reasons))
