"""Rung 4, `compile`: every decoder block and the loss head compile without a graph break,
and compiling changes the numbers by rounding only (DESIGN sections 1 and 5).

The rung trains the workspace recipe for the checklist's `steps` on the same repeated batch with
per-block `torch.compile` (the recipe's `compile.backend`), then asks dynamo, block by block on the
inputs each block really received, how many graphs it made and why it broke
(`titan_core.compile.explain_blocks`); its step-1 loss is compared with the eager rung's evidence in
the recipe's own precision, its speed set beside eager's. A MoE recipe with the reference loop
experts runs with `kernels.moe = "dense"` (mode_recipe.DENSE_WHY).

Its gate is checklists/compile.yaml; what it measures is CompileMeasurements
(onboard/ladder/measurements/training_measurements.py), built once at the end of `run` from the graph
breaks' part (`break_report`) and the run's (`measure_run`).
"""

from __future__ import annotations

from onboard.rungs import run_compare, gate_recipe, mode_recipe, train_run
from onboard.ladder.measurements.training_measurements import CompileMeasurements
from onboard.ladder.contract import RungContext, RungResult
from titan_core.compile import dynamo_compile_seconds, explain_blocks
from titan_core.config.execution_modes import MODE_KEYS
from titan_core.measure.numerics import rel
import torch

RUNG = "compile"


def break_report(report: dict) -> tuple[CompileMeasurements, dict]:
    """(the record's graph-break part, details) from explain_blocks' per-module report."""
    blocks = {p: b for p, b in report.items() if p.startswith("layers.")}
    first = next((b for b in report.values() if b.breaks), None)
    m = CompileMeasurements(
        graph_breaks=sum(b.breaks for b in report.values()),
        graph_breaks_in_blocks=sum(b.breaks for b in blocks.values()),
        graph_breaks_in_loss_head=sum(b.breaks for p, b in report.items() if p == "loss_head"),
        modules_compiled=len(report),
        modules_with_breaks=[p for p, b in report.items() if b.breaks],
        first_break=f"{first.path}: {first.reasons[0]}" if first and first.reasons else None,
    )
    details = {p: {"graphs": b.graphs, "breaks": b.breaks, "reasons": b.reasons} for p, b in report.items()}
    return m, details


def last_loss_rel(rows: list[dict], eager_evidence: dict) -> float | None:
    """Last-step loss against the eager rung's last loss after as many steps (None: not comparable)."""
    if "last_loss" not in eager_evidence or eager_evidence.get("steps_run") != len(rows):
        return None
    return rel(rows[-1]["loss"], float(eager_evidence["last_loss"]))


def run(ctx: RungContext) -> RungResult:
    base = gate_recipe.job_config(ctx)
    args = gate_recipe.model_args(base)
    moe, moe_why = mode_recipe.capture_moe(base, args)
    steps = gate_recipe.param(RUNG, "steps")
    cfg = mode_recipe.mode_config(base, ctx.attempt_dir, mode="compile", steps=steps, moe=moe)
    flags = [f"--{MODE_KEYS['compile']}=true"] + ([f"--kernels.moe={moe}"] if moe else [])
    ctx.log(
        f"compile: per-block torch.compile, backend {cfg.compile.backend}, fullgraph {cfg.compile.fullgraph}, "
        f"{args.n_layers} blocks" + (" + loss head" if args.kind.loss_head else "")
        + ("; MoE experts: kernels.moe = dense (the recipe's loop syncs the host; measurements.moe_why)" if moe else "")
    )
    trainer, result, compile_s = train_compiled(ctx, cfg)
    ctx.log(f"compile: trained, {compile_s:.1f} s compiling; counting graph breaks per block (torch._dynamo.explain)")
    breaks, per_module = break_report(explain(trainer))
    m = CompileMeasurements.from_parts(
        breaks, measure_run(ctx, result.metrics),
        backend=cfg.compile.backend, fullgraph=cfg.compile.fullgraph, compile_time_s=compile_s,
        precision=gate_recipe.precision(cfg.training),
        moe_experts=moe or (cfg.kernels.moe if args.n_experts else None), moe_why=moe_why, flags=" ".join(flags),
    )  # fmt: skip
    ctx.log(
        f"compile: {m.graph_breaks} graph breaks in {m.modules_compiled} compiled modules; step-1 loss rel "
        f"{m.step1_loss_rel_err:.2e} vs eager; beside eager's run, {m.vs_eager_context}"
    )
    rows = result.metrics
    return gate_recipe.result(ctx, base, m, {
        "device": result.device,
        "gate_overrides": gate_recipe.gate_overrides(ctx, cfg),
        "per_module": per_module,
        "loss_curve": [r["loss"] for r in rows],
        "swaps": dict(result.swaps),
        "metrics_file": ctx.workspace.key_for(ctx.attempt_dir / "metrics.jsonl"),
        "reproduce": gate_recipe.train_command(ctx, flags),
    })  # fmt: skip


def train_compiled(ctx: RungContext, cfg):
    """(trainer, result, seconds compiling) of the recipe under per-block torch.compile, from a fresh cache."""

    torch._dynamo.reset()  # a fresh cache: compile time and graph counts are this run's own
    before = dynamo_compile_seconds()
    trainer, result = train_run.train(ctx, cfg, "compile")
    return trainer, result, dynamo_compile_seconds() - before


def explain(trainer) -> dict:
    """explain_blocks' per-module report, on the inputs each block really receives."""
    with train_run.quiet_mesh_pickling():
        return explain_blocks(trainer.model, next(trainer.data))


def measure_run(ctx: RungContext, rows: list[dict]) -> CompileMeasurements:
    """The record's run part: the compiled run's losses against the eager evidence, and its speed beside eager's."""
    loss1, eager_loss1 = rows[0]["loss"], run_compare.eager_step1_loss(ctx)
    steady = run_compare.steady(rows)
    return CompileMeasurements.from_parts(
        steady, run_compare.beside_eager(steady, ctx.evidence),
        steps_run=len(rows),
        step1_loss=loss1,
        baseline_step1_loss=eager_loss1,
        step1_loss_rel_err=rel(loss1, eager_loss1),
        # rounding differences compound over the steps: shown, not judged
        last_loss_rel_vs_eager=last_loss_rel(rows, ctx.evidence.get("eager") or {}),
        first_step_time_s=rows[0]["step_time_s"],
    )
