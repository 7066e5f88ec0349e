"""Rung 4, `compile`: every decoder block and the loss head compile without a graph break,
and compiling changes the numbers by rounding only (DESIGN sections 1 and 5).

The rung trains the workspace recipe for the checklist's `steps` on the same repeated
batch with per-block `torch.compile` (`--compile.enable`, the recipe's `compile.backend`),
then asks dynamo, block by block on the inputs each block really received, how many
graphs it made and why it broke (`titan_core.compile.explain_blocks`). Measured:

- graph breaks per compiled module, with dynamo's reasons (the gate requires 0);
- step-1 loss against the eager rung's evidence, relative error (the eager rung ran the
  same recipe unsharded, and the simple_fsdp rung showed its sharded step equals it), in the
  recipe's own precision and judged by that precision's bound;
- that the compiled run did every planned step with a finite loss and grad norm;
- compile time (dynamo + backend, paid on the first step), steady step time and peak
  memory, beside the eager rung's.

A MoE recipe with the reference loop experts runs with `kernels.moe = "dense"` (see
harness.DENSE_WHY); `flags` in the measurements lists exactly what was verified.
"""

from __future__ import annotations

from dataclasses import dataclass

from titan_core.models.flux.config import flux_of_args

from onboard.rungs import harness
from onboard.rungs.contract import ABSENT, RungContext, RungResult

RUNG = "compile"
reads_recipe_key = harness.reads_all_but_mode


@dataclass(kw_only=True)
class CompileMeasurements(harness.ModeRun):
    """The compile rung's measurements: graph breaks per compiled module, and the compiled run's numbers."""

    graph_breaks: int = ABSENT
    """Graph breaks dynamo reports over every compiled module, blocks and loss head (count)."""
    graph_breaks_in_blocks: int = ABSENT
    """Those in the decoder blocks (count)."""
    graph_breaks_in_loss_head: int = ABSENT
    """Those in the loss head (count)."""
    modules_compiled: int = ABSENT
    """Modules compiled as one graph each: every block and the loss head (count)."""
    modules_with_breaks: list[str] = ABSENT
    """The module paths that broke (e.g. ["layers.0", "layers.1"])."""
    first_break: str | None = ABSENT
    """The first module that broke and dynamo's first reason ("<module>: <reason>"); None: none did."""
    steps_run: int = ABSENT
    """Optimizer steps the compiled run logged."""
    step1_loss_repr: str = ABSENT
    """The compiled step-1 loss, as its repr (nats per token)."""
    baseline_step1_loss_repr: str = ABSENT
    """The eager rung's step-1 loss it is compared with, as its repr."""
    step1_loss_rel_err: float = ABSENT
    """|compiled - eager| / |eager| step-1 loss (fraction): rounding only, or a compile that changes the model."""
    last_loss_rel_vs_eager: float | None = ABSENT
    """The same at the last step (rounding compounds over the steps: shown, not judged); None when
    eager ran another number of steps."""
    backend: str = ABSENT
    """The recipe's compile.backend (inductor, aot_eager, ...)."""
    fullgraph: bool = ABSENT
    """The recipe's compile.fullgraph."""


MEASUREMENTS = CompileMeasurements


def break_report(report: dict) -> tuple[dict, dict]:
    """(measurements, details) from explain_blocks' per-module report."""
    blocks = {p: b for p, b in report.items() if p.startswith("layers.")}
    first = next((b for b in report.values() if b.breaks), None)
    m = {
        "graph_breaks": sum(b.breaks for b in report.values()),
        "graph_breaks_in_blocks": sum(b.breaks for b in blocks.values()),
        "graph_breaks_in_loss_head": sum(b.breaks for p, b in report.items() if p == "loss_head"),
        "modules_compiled": len(report),
        "modules_with_breaks": [p for p, b in report.items() if b.breaks],
        "first_break": f"{first.path}: {first.reasons[0]}" if first and first.reasons else None,
    }
    details = {p: {"graphs": b.graphs, "breaks": b.breaks, "reasons": b.reasons} for p, b in report.items()}
    return m, details


def last_loss_rel(rows: list[dict], eager_evidence: dict) -> float | None:
    """Last-step loss against the eager rung's last loss after as many steps (None: not comparable)."""
    from titan_core.measure.numerics import rel  # lazy: loads torch; onboard status imports the rungs

    if "last_loss_repr" not in eager_evidence or eager_evidence.get("steps_run") != len(rows):
        return None
    return rel(rows[-1]["loss"], float(eager_evidence["last_loss_repr"]))


def run(ctx: RungContext) -> RungResult:
    base = harness.job_config(ctx)
    args = harness.model_args(base)
    moe, moe_why = harness.capture_moe(base, args)
    steps = harness.param(RUNG, "steps")
    cfg = harness.mode_config(base, ctx.attempt_dir, steps=steps, moe=moe, compile={"enable": True})
    flags = ["--compile.enable=true"] + ([f"--kernels.moe={moe}"] if moe else [])
    ctx.log(
        f"compile: per-block torch.compile, backend {cfg.compile.backend}, fullgraph {cfg.compile.fullgraph}, "
        f"{args.n_layers} blocks" + ("" if flux_of_args(args) is not None else " + loss head")
        + ("; MoE experts: kernels.moe = dense (the recipe's loop syncs the host; measurements.moe_why)" if moe else "")
    )
    trainer, result, compile_s = train_compiled(ctx, cfg)
    ctx.log(f"compile: trained, {compile_s:.1f} s compiling; counting graph breaks per block (torch._dynamo.explain)")
    breaks, per_module = break_report(explain(trainer))
    m = CompileMeasurements(
        **breaks, backend=cfg.compile.backend, fullgraph=cfg.compile.fullgraph, compile_time_s=compile_s,
        precision=harness.precision(cfg.training),
        moe_experts=moe or (cfg.kernels.moe if args.n_experts else None), moe_why=moe_why, flags=" ".join(flags),
    )  # fmt: skip
    measure_run(m, ctx, result.metrics)
    ctx.log(
        f"compile: {m.graph_breaks} graph breaks in {m.modules_compiled} compiled modules; step-1 loss rel "
        f"{m.step1_loss_rel_err:.2e} vs eager; {m.step_time_median_s * 1e3:.0f} ms/step; {m.vs_eager_text}"
    )
    rows = result.metrics
    return RungResult(
        measurements=m,
        files_read=harness.files_read(ctx, base),
        command=harness.next_step_command(ctx),
        details={
            "device": result.device,
            "gate_overrides": harness.gate_overrides(ctx, cfg),
            "per_module": per_module,
            "loss_curve": [r["loss"] for r in rows],
            "swaps": dict(result.swaps),
            "metrics_file": ctx.workspace.key_for(ctx.attempt_dir / "metrics.jsonl"),
            "reproduce": harness.train_command(ctx, flags),
        },
    )


def train_compiled(ctx: RungContext, cfg):
    """(trainer, result, seconds compiling) of the recipe under per-block torch.compile, from a fresh cache."""
    import torch  # lazy: torch; onboard status imports the rungs

    from titan_core.compile import dynamo_compile_seconds  # lazy: loads torch; onboard status imports the rungs

    torch._dynamo.reset()  # a fresh cache: compile time and graph counts are this run's own
    before = dynamo_compile_seconds()
    trainer, result = harness.train(ctx, cfg, "compile")
    return trainer, result, dynamo_compile_seconds() - before


def explain(trainer) -> dict:
    """explain_blocks' per-module report, on the inputs each block really receives."""
    from titan_core.compile import explain_blocks  # lazy: loads torch; onboard status imports the rungs

    with harness.quiet_mesh_pickling():
        return explain_blocks(trainer.model, next(trainer.data))


def measure_run(m: CompileMeasurements, ctx: RungContext, rows: list[dict]) -> None:
    """The compiled run's losses against the eager evidence, and its speed beside eager's."""
    from titan_core.measure.numerics import rel  # lazy: loads torch; onboard status imports the rungs

    loss1, eager_loss1 = rows[0]["loss"], harness.eager_step1_loss(ctx)
    m.update(
        steps_run=len(rows),
        step1_loss_repr=repr(loss1),
        baseline_step1_loss_repr=repr(eager_loss1),
        step1_loss_rel_err=rel(loss1, eager_loss1),
        # rounding differences compound over the steps: shown, not judged
        last_loss_rel_vs_eager=last_loss_rel(rows, ctx.evidence.get("eager") or {}),
        first_step_time_s=rows[0]["step_time_s"],
        **harness.run_stats(rows),
    )
    harness.beside_eager(m, ctx.evidence)
