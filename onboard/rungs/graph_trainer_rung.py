"""Rung 5, `graph_trainer`: the whole train step (forward, loss, backward, clipping, AdamW)
captured as one graph that runs without the host waiting on the device, and exactly
eager's arithmetic when it runs uncompiled (DESIGN sections 1, 5 and 6). Four parts, in this process:

1. probe (tracing only, weights untouched): every host sync the step would make
   (`find_host_syncs`), and the saved-activation bytes of each memory policy;
2. exactness: the recipe for the checklist's `exact_steps` eagerly and as a captured step run
   uncompiled and unsplit (EXACT), both deterministic: losses, grad norms, parameters and AdamW
   state `torch.equal`; programs launched per step and captures per run;
3. speed: the recipe's own `[graph_trainer]` settings for `timed_steps` steps: trace, pass and
   backend compile time, step time and peak memory, beside the eager and compile rungs';
4. choice: when the checks of part 2 hold, the recipe's execution mode among the modes that
   passed (`execution_mode.choose`).

A MoE recipe with the reference loop experts runs with `kernels.moe = "dense"` (see
mode_recipe.DENSE_WHY), in the eager and the captured run alike.

Its gate is checklists/graph_trainer.yaml; what it measures is GraphTrainerMeasurements
(onboard/ladder/measurements/training_measurements.py): each part returns its own fields of that
record, built by keyword, and `run` builds the record once from them.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from typing import Any

from onboard.rungs import execution_mode, gate_recipe, mode_recipe, run_compare, train_run
from onboard.ladder.measurements.training_measurements import GraphTrainerMeasurements
from onboard.ladder.contract import ABSENT, RecipeEdit, RungContext, RungResult
from titan_core.measure.numerics import rel, rel_l2
from titan_core.parallel import local_tensor as _local
import torch
from titan_core.config.execution_modes import MODE_KEYS
from titan_core.compile.graph_trainer import CaptureError, HostSyncError, find_host_syncs, measure_memory_policies

RUNG = "graph_trainer"
EXACT = {"compile": "none", "numerics_changing": False, "split": False}
"""The [graph_trainer] of the exactness run: captured, uncompiled, unsplit, numerics-preserving passes only."""


@dataclass
class Plan:
    """What every part of the rung runs from: the gate's recipe, the experts the captured runs use."""

    ctx: RungContext
    base: Any
    """The gate's JobConfig (gate_recipe.job_config)."""
    moe: str | None
    """kernels.moe for the eager and captured runs alike (mode_recipe.capture_moe); None keeps the recipe's."""

    @property
    def flags(self) -> list[str]:
        """The `onboard train` flags the rung verifies."""
        return [f"--{MODE_KEYS['graph_trainer']}=true"] + ([f"--kernels.moe={self.moe}"] if self.moe else [])

    def config(self, name: str, *, mode: str = "eager", steps: int, deterministic: bool = False, **sections):
        """The gate's recipe for one part's run in `mode`, written under runs/.../<name>/."""
        out = self.ctx.attempt_dir / name
        return mode_recipe.mode_config(self.base, out, mode=mode, steps=steps, deterministic=deterministic,
                                       moe=self.moe, **sections)  # fmt: skip

    def result(self, m: GraphTrainerMeasurements, details: dict, edits: list[RecipeEdit] | None = None) -> RungResult:
        return gate_recipe.result(self.ctx, self.base, m, details, edits)


def run(ctx: RungContext) -> RungResult:
    base = gate_recipe.job_config(ctx)
    args = gate_recipe.model_args(base)
    moe, moe_why = mode_recipe.capture_moe(base, args)
    plan = Plan(ctx, base, moe)
    precision = gate_recipe.precision(base.training)
    own = GraphTrainerMeasurements(moe_experts=moe or (base.kernels.moe if args.n_experts else None), moe_why=moe_why,
                                   flags=" ".join(plan.flags), precision=precision)  # fmt: skip
    ctx.log(
        f"graph_trainer: capture the whole step of {args.n_layers} blocks"
        + ("; MoE experts: kernels.moe = dense (the recipe's loop syncs the host; measurements.moe_why)" if moe else "")
    )
    probed, traced, details = probe(plan)
    if not traced or probed.host_syncs:
        ctx.log(f"graph_trainer: not run: {probed.capture_error if not traced else probed.first_host_sync}")
        return plan.result(GraphTrainerMeasurements.from_parts(own, probed, captured=traced), details)
    exact, captured = exactness(plan, details)
    gc.collect()  # the exactness runs' models and optimizer state would inflate the timed run's peak memory
    if not captured:
        return plan.result(GraphTrainerMeasurements.from_parts(own, probed, exact, captured=False), details)
    speed = timed(plan, details)
    gc.collect()
    ctx.log(
        f"graph_trainer: {exact.graphs_per_step} program per step, {probed.host_syncs} host syncs, "
        f"{'bit-identical' if exact.bit_identical else 'NOT bit-identical'} to eager over {exact.exact_steps} steps; "
        f"compile={base.graph_trainer.compile}; beside eager's run, {speed.vs_eager_context}"
    )
    edits, choice = [], GraphTrainerMeasurements()
    within = exact.exact_rel_err <= gate_recipe.bound(RUNG, "exact_to_eager", precision, ctx.evidence)
    if within and exact.graphs_per_step == 1 and exact.captures_per_run == 1:
        edits, choice = choose_mode(plan, probed, details)
    # the record, once: the rung's own fields, then each part's (probe, exactness, speed, choice)
    m = GraphTrainerMeasurements.from_parts(own, probed, exact, speed, choice, captured=True)
    return plan.result(m, details, edits)


# ---- 1. probe ---------------------------------------------------------------------------------
def probe(plan: Plan) -> tuple[GraphTrainerMeasurements, bool, dict]:
    """(the record's probe part: host syncs and memory-policy bytes of the captured step, or why it could
    not be traced; whether it traced; details), by tracing a fresh model."""
    cfg = plan.config("probe", steps=1)
    trainer = train_run.build_trainer(cfg)
    try:
        batches = [next(trainer.data) for _ in range(cfg.training.grad_accum)]
        plan.ctx.log("graph_trainer: tracing the step to look for host syncs")
        try:
            syncs = find_host_syncs(trainer.model, trainer.optimizer, batches, max_norm=cfg.training.max_norm)
        except CaptureError as e:
            return GraphTrainerMeasurements(capture_error=str(e)), False, {}
        first = f"{syncs[0].op}: {syncs[0].why} at {syncs[0].where or '?'}" if syncs else None
        saved: dict[str, int] = {}  # a found sync: it traced the rest, and is the finding
        if not syncs:
            plan.ctx.log("graph_trainer: saved activations under each memory policy (tracing only)")
            policies = measure_memory_policies(
                trainer.model, trainer.optimizer, batches, max_norm=cfg.training.max_norm,
                scan_layers=cfg.graph_trainer.scan_layers,
            )  # fmt: skip
            for name, b in policies.items():
                saved[f"saved_activation_bytes_{name}"] = b.device
                if b.host:
                    saved[f"saved_activation_host_bytes_{name}"] = b.host
        m = GraphTrainerMeasurements(host_syncs=len(syncs), first_host_sync=first, saved_activations=saved)
        return m, True, {"host_syncs": [{"op": s.op, "why": s.why, "where": s.where} for s in syncs]}
    finally:
        trainer.close()


# ---- 2. exactness -----------------------------------------------------------------------------
def exactness(plan: Plan, details: dict) -> tuple[GraphTrainerMeasurements, bool]:
    """(the record's exactness part, whether the captured run ran): eager and the captured step
    (uncompiled) for `exact_steps`, both deterministic, compared bit for bit; a run that could not be
    captured is measured so (capture_error)."""
    ctx, steps = plan.ctx, gate_recipe.param(RUNG, "exact_steps")
    e_cfg = one_thread_on_cpu(plan.config("eager", steps=steps, deterministic=True))
    g_cfg = one_thread_on_cpu(plan.config("exact", mode="graph_trainer", steps=steps, deterministic=True,
                                          graph_trainer=EXACT))  # fmt: skip
    e_tr, e_res = train_run.train(ctx, e_cfg, "graph_trainer: eager reference")
    try:
        g_tr, g_res = train_run.train(ctx, g_cfg, "graph_trainer: captured step, uncompiled")
    except (CaptureError, HostSyncError) as e:
        return GraphTrainerMeasurements(capture_error=str(e)), False
    stats = g_tr.graph_step.stats
    m = GraphTrainerMeasurements.from_parts(
        compare_runs(e_tr, e_res.metrics, g_tr, g_res.metrics),
        captures_per_run=stats.captures, graphs_per_step=max(stats.programs_per_step), exact_steps=steps,
        eager_step1_loss_rel_err=rel(g_res.metrics[0]["loss"], run_compare.eager_step1_loss(ctx)),
    )
    details.update(
        exact_loss_curve=[r["loss"] for r in g_res.metrics],
        eager_loss_curve=[r["loss"] for r in e_res.metrics],
        passes=[{"name": p.name, "nodes_before": p.nodes_before, "nodes_after": p.nodes_after}
                for p in stats.pass_records],
    )  # fmt: skip
    return m, True


def one_thread_on_cpu(cfg):
    if gate_recipe.resolved_device_type(cfg.device.type) == "cpu":
        # once here, on a loaded machine, eager and the captured step (2 threads each) ended
        # 3e-5 apart in layers.0.attention.wk after 3 steps, and never again when idle: a
        # threaded kernel's summation order is not promised across runs; one thread fixes
        # it, so equal means equal and a difference is the capture's
        cfg.device.threads = 1
    return cfg


def compare_runs(eager_tr, eager_rows, graph_tr, graph_rows) -> GraphTrainerMeasurements:
    """Exactness of the captured run against the eager one (the record's part): bit equality and, when it
    fails, where."""

    losses = [r["loss"] for r in graph_rows] == [r["loss"] for r in eager_rows]
    norms = [r["grad_norm"] for r in graph_rows] == [r["grad_norm"] for r in eager_rows]
    worst_param, worst_diff, params_equal, state_equal = None, 0.0, True, True
    eager_named = dict(eager_tr.model.named_parameters())
    for name, q in graph_tr.model.named_parameters():
        a, b = _local(eager_named[name].detach()), _local(q.detach())
        if not torch.equal(a, b):
            params_equal = False
            diff = (a.double() - b.double()).abs().max().item()
            if diff >= worst_diff:
                worst_param, worst_diff = name, diff
        se, sg = eager_tr.optimizer.state[eager_named[name]], graph_tr.optimizer.state[q]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key in se and key in sg and not torch.equal(_local(se[key]), _local(sg[key])):
                state_equal = False
    loss_diff = max((abs(a["loss"] - b["loss"]) for a, b in zip(graph_rows, eager_rows)), default=0.0)
    bit_identical = losses and norms and params_equal and state_equal and len(graph_rows) == len(eager_rows)
    return GraphTrainerMeasurements(
        bit_identical=bit_identical,
        exact_rel_err=0.0 if bit_identical else exact_rel_err(eager_tr, eager_rows, graph_tr, graph_rows),
        losses_equal=losses,
        grad_norms_equal=norms,
        params_equal=params_equal,
        optimizer_state_equal=state_equal,
        loss_max_abs_diff=loss_diff,
        params_max_abs_diff=worst_diff,
        first_differing_param=worst_param,
    )


def exact_rel_err(eager_tr, eager_rows, graph_tr, graph_rows) -> float:
    """The worst relative error of a captured run that is not bit-identical to eager (`exact_rel_err`):
    what a bf16 recipe's exactness is judged by, where the two runs' kernels may round differently."""
    if len(graph_rows) != len(eager_rows):
        return math.inf
    errs = [rel(b[k], a[k]) for a, b in zip(eager_rows, graph_rows) for k in ("loss", "grad_norm")]
    eager_named = dict(eager_tr.model.named_parameters())
    for name, q in graph_tr.model.named_parameters():  # the weights the steps leave, not AdamW's moments:
        # a moment one bf16 ulp apart is 0.4% of itself, yet moves the weights by far less
        errs.append(rel_l2(_local(q.detach()).float(), _local(eager_named[name].detach()).float()))
    worst = max(errs, default=0.0)
    return worst if worst > 0 and not math.isnan(worst) else math.inf  # unequal, yet no error measures it


# ---- 3. speed ---------------------------------------------------------------------------------
def timed(plan: Plan, details: dict) -> GraphTrainerMeasurements:
    """The record's speed part: the recipe's own [graph_trainer] settings for `timed_steps`: capture and
    compile times, speed, memory, beside the eager and compile rungs'."""
    ctx, gt = plan.ctx, plan.base.graph_trainer
    cfg = plan.config("timed", steps=gate_recipe.param(RUNG, "timed_steps"), mode="graph_trainer")
    ctx.log(
        f"graph_trainer: timed run with the recipe's settings: compile {gt.compile}, memory policy "
        f"{gt.memory_policy}, scan_layers {gt.scan_layers}, split {gt.split}"
    )
    trainer, result = train_run.train(ctx, cfg, "graph_trainer: timed")
    rows, ts = result.metrics, trainer.graph_step.stats
    steady = run_compare.steady(rows)
    compiled = (ctx.evidence.get("compile") or {}).get("step_time_median_s")  # where the compile rung passed
    out = ctx.attempt_dir
    details.update(
        device=result.device,
        gate_overrides=gate_recipe.gate_overrides(ctx, cfg),
        loss_curve=[r["loss"] for r in rows],
        metrics_files={k: ctx.workspace.key_for(out / k / "metrics.jsonl") for k in ("eager", "exact", "timed")},
        reproduce=gate_recipe.train_command(ctx, plan.flags),
    )
    return GraphTrainerMeasurements.from_parts(
        steady, run_compare.beside_eager(steady, ctx.evidence),
        graph_compile=gt.compile, memory_policy=gt.memory_policy, scan_layers=gt.scan_layers, split=gt.split,
        timed_programs_per_step=max(ts.programs_per_step), trace_time_s=ts.trace_time_s,
        passes_time_s=ts.passes_time_s, backend_compile_time_s=ts.compile_time_s,
        compile_time_s=ts.trace_time_s + ts.passes_time_s + ts.compile_time_s, first_step_time_s=rows[0]["step_time_s"],
        compile_rung_step_time_median_s=compiled or ABSENT,
        speedup_vs_compile_rung=compiled / steady.step_time_median_s if compiled else ABSENT,
    )  # fmt: skip


# ---- 4. the recipe's execution mode -------------------------------------------------------------
def choose_mode(plan: Plan, probed: GraphTrainerMeasurements,
                details: dict) -> tuple[list[RecipeEdit], GraphTrainerMeasurements]:  # fmt: skip
    """(its edits, the record's choice part): the recipe's execution mode among the modes whose checks held
    (execution_mode.choose), and its memory policy (`probed`: the probe's part, its saved activations)."""
    ctx, gt = plan.ctx, plan.base.graph_trainer
    modes = ["eager"] + (["compile"] if "compile" in ctx.evidence else []) + ["graph_trainer"]
    edits, record = execution_mode.choose(ctx, plan.base, rung=RUNG, moe=plan.moe, modes=modes)
    # a memory policy trades compute for memory: it earns its place only when memory binds,
    # which the gate's small batch never shows; the recipe's policy stays, said so
    prefix = "saved_activation_bytes_"
    saved = {k.removeprefix(prefix): v for k, v in probed.saved_activations.items() if k.startswith(prefix)}
    details["decisions"] = record.pop("decisions")  # the lever's Decision: status and the report print it
    details["execution_mode"] = record
    ctx.log(f"graph_trainer: the recipe's execution mode: {record['execution_mode']} ({record['execution_mode_why']})")
    return edits, GraphTrainerMeasurements(
        execution_mode=record["execution_mode"],
        execution_mode_why=record["execution_mode_why"],
        memory_policy_choice=gt.memory_policy,
        memory_policy_why=(
            f"kept the recipe's {gt.memory_policy!r}: saved activations per policy {saved} bytes; at the gate's "
            "batch no memory budget binds, so recomputing would only cost time"
        ),
    )
