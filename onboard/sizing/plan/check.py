"""`onboard plan --check`: the recipe a plan wrote, run here as planned: its layout, its execution mode
and memory policy, its sequence and batch, on the workspace's twin, shrunk only where this machine
forces it, each shrink said.

A plan is a prediction for a machine that is not here, but its recipe is a combination (the mesh, the
execution mode, activation checkpointing or the Graph Trainer's memory policy, kernels, precision) that
must hold together, and a memory prediction that must hold for the layout it names. So the check takes
the recipe as written (the loader's types and range checks) and trains it CHECK_STEPS steps on gloo
processes of this CPU, on the model the gates ran (the twin, or the full model when it fits here):

- every planned degree above 1 at 2 (dp_shard, dp_replicate, tp, ep, cp, pp; ep is carved from
  dp_shard x cp), at most MAX_RANKS processes: past it dp_replicate, then dp_shard go back to 1;
- the planned execution mode, memory policy and kernels (a kernel that cannot run here, a TPU's splash
  attention or grouped_mm traced in fp32, replaced by the path the gates verified, and said);
- the planned batch per rank, halved only while a step would not fit this host's memory or
  STEP_BUDGET_S of this CPU, then the planned sequence the same way (the longest that fits: the
  activations of a long sequence are what the memory prediction is mostly about); a pipeline's
  microbatches per stage as planned (PP_MICROBATCHES), its schedule unless the twin has too few layers;
- nothing saved, exported or profiled; output under runs/plan-check/<target>.seqN.

The outcome: whether the recipe loads, whether titan_core accepted the combination (its refusal, if
not), what ran (degrees, ranks, mode, memory policy, sequence, batch), each step's loss and grad norm
(all finite or not), and the memory: rank 0's tensors at its step's peak, counted at the dispatcher
(metrics.tensor_peak: a CPU's resident set also holds what malloc keeps and the runtime's own), against
titan_core's estimate for the same shrunk layout (the one memory model the plan fits with), within
MEMORY_TOLERANCE; each as a fraction of this host's per-rank budget too.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

from onboard.rungs import gate_recipe
from onboard.rungs.kernels_rung.compare import applicable_kernels
from onboard.rungs.parallel_degrees import share_cores
from onboard.workspace.layout import Workspace
from titan_core.config import ConfigError, load_config
from titan_core.config.loader import get_key, set_key
from titan_core.config.execution_modes import execution_mode
from titan_core.memory.budget import cpu_budget
from titan_core.memory.preflight import estimate_for
from titan_core.models.common.stats import flops_per_token
from titan_core.parallel import check_parallelism
from titan_core.parallel.pipeline import STAGES_PER_RANK
from titan_core import launcher
from titan_core.lora.inject import planned_lora_params
from titan_core.runtime.cpu_peak import measured_cpu_peak
from titan_core.models.model_builder import build_meta_model, model_adapter

CHECK_STEPS = 2
"""Steps the check runs: step 1 runs the plan's combination on fresh weights, step 2 on weights the
optimizer has updated once (a non-finite update shows there)."""
DEGREES = ("dp_replicate", "dp_shard", "tp", "ep", "cp", "pp")
MAX_RANKS = 8
"""gloo processes the check starts at most (the mesh of every degree at 2 needs up to 32)."""
SHED = ("dp_replicate", "dp_shard")
"""Degrees set back to 1, in this order, while the world passes MAX_RANKS (the model parallelisms stay)."""
STEP_BUDGET_S = 20.0
"""The most one step may be predicted to take on this CPU (its FLOPs over CPU_EFFICIENCY of the CPU's measured
peak in the dtype the check computes in); past it the batch, then the sequence, is halved."""
CPU_EFFICIENCY = 0.1
"""Fraction of this CPU's matmul peak a twin's training step reaches (small matmuls, gloo ranks sharing cores)."""
MEMORY_SHARE = 0.5
"""Fraction of this host's available memory the check's ranks may be predicted to take together."""
MIN_SEQ = 64
MEMORY_TOLERANCE = 0.25
"""Measured over predicted memory of the shrunk layout must lie within 1 +- this."""
CHECK_TIMEOUT_S = 900.0
"""A check that takes longer ends as failed, never a hung command."""
CPU_STAND_IN = {"attention": "sdpa"}
"""The path a kernel field falls back to on this CPU when the plan's kernel cannot run here
(experts: `_moe_stand_in`, which depends on the execution mode)."""


def check_plan_recipe(ws: Workspace, recipe_path: Path) -> dict[str, Any]:
    """Load the plan's recipe and run its layout here (module docstring); JSON-ready."""
    out: dict[str, Any] = {"recipe": str(recipe_path), "steps": CHECK_STEPS, "loads": False, "refused": None,
                           "changed_here": [], "rows": [], "finite": False, "ok": False}  # fmt: skip
    try:
        planned = load_config(recipe_path)
    except ConfigError as e:
        out["refused"] = f"the recipe does not load: {e}"
        return out
    out["loads"] = True
    try:
        mode = _mode(planned)  # the check changes no mode key: the plan's mode is the one run here
    except ConfigError as e:  # two execution modes at once: titan_core's refusal, before anything runs
        out["refused"] = " ".join(str(e).split())
        return out
    cfg, changes = cpu_run_config(ws, planned)
    out.update(model=ws.model_label(), mode=mode, precision=gate_recipe.precision(cfg.training))
    try:
        world, shrinks = shrink_layout(cfg, planned)
        meta = _meta(cfg)
        shrinks += fit_here(cfg, check_parallelism(cfg, world), meta)
        degrees = check_parallelism(cfg, world)  # again: the shorter sequence and batch are judged too
        est = _estimate(cfg, degrees, meta)
    except ConfigError as e:  # titan_core refuses the combination (a degree with the mode, ...)
        out["changed_here"] = changes
        out["refused"] = " ".join(str(e).split())
        return out
    out["changed_here"] = changes + shrinks
    out["ran"] = ran(cfg, world)
    share_cores(cfg, world)
    start = time.perf_counter()
    try:
        result = launcher.run_world(cfg, world, timeout_s=CHECK_TIMEOUT_S)
    except ConfigError as e:
        out["refused"] = " ".join(str(e).split())
        return out
    out["seconds"] = round(time.perf_counter() - start, 2)
    rows = result.metrics
    out["rows"] = [{"step": r["step"], "loss": r["loss"], "grad_norm": r["grad_norm"]} for r in rows]
    if not result.ok:
        out["refused"] = result.launch.refusal()
    out["finite"] = result.ok and len(rows) == CHECK_STEPS and all(
        math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows
    )
    out["memory"] = memory_verdict(rows, est, world)
    out["ok"] = out["finite"] and bool(out["memory"] and out["memory"]["within"])
    return out


def _meta(cfg) -> tuple[Any, Any]:
    """(args, meta model) of the model the check runs, built once."""
    args = gate_recipe.model_args(cfg)
    return args, build_meta_model(cfg.model, args)


def _estimate(cfg, degrees, meta: tuple[Any, Any]):
    """titan_core's estimate of one rank of `cfg` at `degrees` on this CPU (what its preflight computes)."""
    args, model = meta
    lora = planned_lora_params(model, cfg.lora, model_adapter(cfg.model)) if cfg.lora.enable else -1
    return estimate_for(cfg, model, args, "cpu", degrees, lora_params=lora)[2]


def memory_verdict(rows: list[dict], est, world: int) -> dict[str, Any] | None:
    """Rank 0's tensors at its step's peak (`tensor_peak_bytes`: parameters and optimizer state held, plus the most
    the step allocated at once) against the estimate's training moments less its runtime constant (the
    tensors it predicts), each also as a fraction of this host's per-rank budget."""
    counted = [r["tensor_peak_bytes"] for r in rows if "tensor_peak_bytes" in r]
    if not counted:
        return None
    measured = max(counted)
    predicted = max(est.forward_backward, est.optimizer_step) - est.overhead
    budget = cpu_budget()
    per_rank = budget.bytes / world if budget else None
    ratio = measured / predicted if predicted else math.inf
    return {
        "measured_bytes": measured, "predicted_bytes": predicted, "ratio": ratio,
        "within": abs(ratio - 1) <= MEMORY_TOLERANCE, "tolerance": MEMORY_TOLERANCE,
        "budget_per_rank_bytes": per_rank,
        "measured_fraction": measured / per_rank if per_rank else None,
        "predicted_fraction": predicted / per_rank if per_rank else None,
        "how": "rank 0's tensors at its step's peak, counted at the dispatcher (metrics.tensor_peak), against "
               "titan_core's estimate of the same layout (forward/backward turn and optimizer step, tensors only)",
    }  # fmt: skip


def ran(cfg, world: int) -> dict[str, Any]:
    """What the check ran: every degree, the ranks, the mode, the memory policy, sequence, batch, microbatches."""
    p, t = cfg.parallelism, cfg.training
    ac = cfg.activation_checkpoint
    captured = execution_mode(cfg) == "graph_trainer"
    return {
        "degrees": {n: getattr(p, n) for n in DEGREES}, "pp_schedule": p.pp_schedule, "ranks": world,
        "mode": _mode(cfg), "memory_policy": cfg.graph_trainer.memory_policy if captured else None,
        "activation_checkpoint": None if captured else
        (f"selective {ac.selective}" if ac.mode == "selective" else ac.mode),
        "seq_len": t.seq_len, "batch": t.batch_size, "grad_accum": t.grad_accum,
    }  # fmt: skip


def shrink_layout(cfg, planned) -> tuple[int, list[dict[str, Any]]]:
    """Every planned degree above 1 at 2, at most MAX_RANKS ranks (SHED first); (world, the shrinks said)."""
    p, rp = cfg.parallelism, planned.parallelism
    shrinks: list[dict[str, Any]] = []
    for n in DEGREES:
        setattr(p, n, 2 if getattr(rp, n) > 1 else 1)
    p.sequence_parallel = rp.sequence_parallel and p.tp > 1

    def world() -> int:
        return p.pp * p.dp_replicate * p.dp_shard * p.cp * p.tp

    for n in SHED:
        if world() <= MAX_RANKS:
            break
        if n == "dp_shard" and p.ep > 1 and p.cp == 1:
            continue  # ep is carved from dp_shard x cp: it keeps its ranks
        setattr(p, n, 1)
    for n in DEGREES:
        here, plan = getattr(p, n), getattr(rp, n)
        if here != plan:
            why = (f"{MAX_RANKS} processes at most here" if plan > 1 and here == 1 else
                   "each planned degree above 1 runs at 2 on this CPU's gloo processes")
            shrinks.append({"key": f"parallelism.{n}", "plan": plan, "here": here, "why": why})
    layers = gate_recipe.model_args(cfg).n_layers
    if p.pp > 1 and 2 * STAGES_PER_RANK[p.pp_schedule] > layers:
        shrinks.append({"key": "parallelism.pp_schedule", "plan": p.pp_schedule, "here": "1F1B",
                        "why": f"{2 * STAGES_PER_RANK[p.pp_schedule]} stages at pp = 2 need as many layers; the model "
                               f"run here has {layers}"})  # fmt: skip
        p.pp_schedule = "1F1B"
    if p.pp > 1:  # the plan's microbatches per stage, on 2 stages
        micro = max(2, planned.training.grad_accum * 2 // max(1, rp.pp))
        if micro != cfg.training.grad_accum:
            shrinks.append({"key": "training.grad_accum", "plan": planned.training.grad_accum, "here": micro,
                            "why": f"the plan's {planned.training.grad_accum // max(1, rp.pp)} microbatches per "
                                   "stage, on 2 stages"})  # fmt: skip
            cfg.training.grad_accum = micro
    return world(), shrinks


def fit_here(cfg, degrees, meta: tuple[Any, Any]) -> list[dict[str, Any]]:
    """Halve the batch (then the sequence, the longest kept that fits) while a step of the shrunk layout would
    not fit this host's memory (MEMORY_SHARE of it over the ranks) or STEP_BUDGET_S of this CPU; the shrinks
    said."""
    t, cp = cfg.training, max(1, cfg.parallelism.cp)
    budget = cpu_budget()
    room = budget.bytes * MEMORY_SHARE / degrees.world_size if budget else math.inf
    args = meta[0]
    # the peak of the dtype the check computes in: on a CPU without bf16 instructions torch's own bf16 product
    # ran ~45x slower than fp32's (147 ms against 3 ms at the debug model's size), and an fp32 peak let a
    # bf16 check's step run minutes past the budget; the bf16 probe measures the products the ranks get
    # (titan_core/runtime/cpu_bf16.py)
    dtype = gate_recipe.compute_dtype(t)
    peak = measured_cpu_peak(dtype) * CPU_EFFICIENCY
    plan_seq, plan_batch = t.seq_len, t.batch_size

    def fits() -> tuple[bool, str]:
        est = _estimate(cfg, degrees, meta)
        tokens = t.batch_size * t.seq_len * t.grad_accum * degrees.dp
        seconds = flops_per_token(args, t.seq_len) * tokens / peak
        if est.total > room:
            return False, f"{est.total / 2**20:,.0f} MiB per rank, past this host's {room / 2**20:,.0f} MiB"
        if seconds > STEP_BUDGET_S:
            return False, (f"a step predicted at {seconds:.0f} s on this CPU in {str(dtype).removeprefix('torch.')}, "
                           f"past {STEP_BUDGET_S:.0f} s")
        return True, ""

    ok, why = fits()
    batch_why = why
    while not ok and t.batch_size > 1:
        t.batch_size //= 2
        ok, why = fits()
    seq_why = why
    while not ok and t.seq_len // 2 >= MIN_SEQ and (t.seq_len // 2) % (2 * cp) == 0:
        t.seq_len //= 2
        ok, why = fits()
    out = []
    if t.batch_size != plan_batch:
        out.append({"key": "training.batch_size", "plan": plan_batch, "here": t.batch_size,
                    "why": f"the largest that fits here (at the planned one: {batch_why})"})  # fmt: skip
    if t.seq_len != plan_seq:
        out.append({"key": "training.seq_len", "plan": plan_seq, "here": t.seq_len,
                    "why": f"the longest that fits here at batch {t.batch_size} (at the planned one: {seq_why})"})
    return out


def cpu_run_config(ws: Workspace, planned) -> tuple[Any, list[dict[str, Any]]]:
    """(the plan's config as the check runs it here before its layout is shrunk, each value changed: {key, plan,
    here, why})."""
    gates = load_config(ws.recipe_path)
    cfg = copy.deepcopy(planned)
    changes: list[dict[str, Any]] = []

    def put(key: str, value: Any, why: str) -> None:
        was = get_key(cfg, key)
        if was != value:
            set_key(cfg, key, value)
            changes.append({"key": key, "plan": was, "here": value, "why": why})

    put("model.hf_config", gates.model.hf_config, "the model the gates ran (the twin when the full model "
        "does not fit here)")
    put("device.type", "cpu", "this machine")
    put("device.threads", 0, "this CPU's cores shared by the check's processes")
    cfg.training.steps = CHECK_STEPS
    cfg.checkpoint.enable, cfg.checkpoint.export_hf, cfg.profiler.enable = False, "", False
    cfg.validation.enable = False
    cfg.metrics.output_dir = str(ws.runs_dir / "plan-check" / Path(cfg.metrics.output_dir).name)
    cfg.metrics.rich = False
    cfg.metrics.log_freq = 1
    cfg.metrics.tensor_peak = True  # the tensors each step holds, what the estimate counts
    for key, value, why in _cpu_kernels(cfg):
        put(key, value, why)
    return cfg, changes


def _cpu_kernels(cfg) -> list[tuple[str, str, str]]:
    """(key, stand-in, why) for each of the recipe's kernels that cannot run on this CPU."""
    args = gate_recipe.model_args(cfg)
    captured = execution_mode(cfg) != "eager"
    refusals = applicable_kernels(args, device="cpu", dtype=gate_recipe.compute_dtype(cfg.training), captured=captured,
                                  model=build_meta_model(cfg.model, args))  # fmt: skip
    out = []
    for field_name in ("attention", "moe"):
        value = getattr(cfg.kernels, field_name)
        why = refusals.get(f"kernels.{field_name}={value}")
        if why:
            stand_in = _moe_stand_in(captured) if field_name == "moe" else CPU_STAND_IN[field_name]
            out.append((f"kernels.{field_name}", stand_in, f"not checked here: {why}"))
    return out


def _moe_stand_in(captured: bool) -> str:
    """The experts the gates verified in this execution mode: dense where shapes must be static."""
    return "dense" if captured else "loop"


def _mode(cfg) -> str:
    """The check's execution mode in words, with its memory policy; ConfigError for two modes at once."""
    mode = execution_mode(cfg)
    if mode == "graph_trainer":
        scan = ", scanned" if cfg.graph_trainer.scan_layers else ""
        return f"graph_trainer (memory policy {cfg.graph_trainer.memory_policy}{scan})"
    ac = cfg.activation_checkpoint
    policy = "" if ac.mode == "none" else f", activation checkpointing {ac.mode}"
    policy += f" {ac.selective}" if ac.mode == "selective" else ""
    return (f"compile ({cfg.compile.backend})" if mode == "compile" else "eager") + policy


def check_lines(c: dict[str, Any]) -> list[str]:
    """The check as text."""
    head = f"check of {c['recipe']}:"
    if not c["loads"] or (c["refused"] and "ran" not in c):
        return [head, f"  FAILED: {c['refused']}"]
    r = c["ran"]
    above = ", ".join(f"{n} {v}" for n, v in r["degrees"].items() if v > 1) or "every degree 1"
    lines = [head, f"  ran {c['model']} on {r['ranks']} gloo process(es) of this CPU ({above}), {c['mode']}, "
             f"{c['precision']}, seq {r['seq_len']}, batch {r['batch']}, {r['grad_accum']} microbatch(es), "
             f"{c['steps']} steps"]  # fmt: skip
    lines += [f"  here {ch['key']} = {ch['here']!r} (plan: {ch['plan']!r}): {ch['why']}" for ch in c["changed_here"]
              if ch["key"] != "model.hf_config"]  # fmt: skip
    if c["refused"]:
        return lines + [f"  FAILED: {c['refused']}"]
    lines += [f"  step {row['step']}: loss {row['loss']!r}, grad norm {row['grad_norm']!r}" for row in c["rows"]]
    lines.append("  finite: every step's loss and grad norm" if c["finite"] else "  FAILED: not finite")
    m = c.get("memory")
    if m:
        verdict = "within" if m["within"] else "FAILED: outside"
        lines.append(f"  memory: measured {m['measured_bytes'] / 2**20:,.1f} MiB, predicted "
                     f"{m['predicted_bytes'] / 2**20:,.1f} MiB (x{m['ratio']:.2f}, {verdict} "
                     f"{m['tolerance']:.0%})")  # fmt: skip
    return lines
