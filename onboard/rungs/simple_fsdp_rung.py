"""Rung 3, `simple_fsdp`: sharding and mixed precision change nothing they should not.

Through titan_core's launcher (`run_world`) the rung trains the workspace recipe on W local
processes (2 on CPU with gloo, one per device on an accelerator), each rank given B/W rows of the
eager rung's global batch B: fp32 SimpleFSDP against the unsharded baseline at step 1, the bf16
params / fp32 reduce loss curve against the fp32 one, and FSDP2's step time beside SimpleFSDP's.

The baseline is the eager rung's evidence whenever one sharded step is the same arithmetic
as eager's one big batch. The cross-entropy is: titan_core normalises it by the global
count of valid tokens over every rank and micro-batch (titan_core/parallel/token_mean.py), so rows
with ignored labels (text data) spread unevenly over the ranks change nothing. A term
computed per forward pass over a rank's rows is not: a MoE load-balancing loss
(aux_loss_coef != 0). A W-rank step then equals a one-process step with grad_accum = W
over the same rows, so the rung runs that step and compares with it, and says so in
`baseline_why`; the distance to the eager evidence is still recorded. So does a recipe
that is not fp32 (its eager evidence is then no fp32 number).

The runs above are data parallel only (the gate's recipe sets ep = cp = pp = 1). The expert,
context and pipeline degrees the recipe asks for are proved after them, each at 2 against one
process on the same rows, fp32 (onboard/rungs/parallel_degrees.py); a recipe that asks none
records `parallel_degrees_needed = []` and says so.

Its gate is checklists/simple_fsdp.yaml; what it measures is SimpleFsdpMeasurements
(onboard/ladder/measurements/training_measurements.py), built once at the end of `run` from the sharded
runs' part (`measure`), the degrees' (parallel_degrees.py) and the recipe choices' (`recipe_choices`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import titan_core.train
from onboard.errors import BadInput
from onboard.rungs import run_compare, gate_recipe, parallel_degrees, timing_profiles, train_run
from onboard.ladder.measurements.training_measurements import SimpleFsdpMeasurements
from onboard.ladder.contract import ABSENT, RecipeEdit, RungContext, RungResult, record_run
from onboard.ladder.decision import HELD, KEPT, NOT_ELIGIBLE, Decision, decide, holder_set_by
from onboard.ladder.gates import timed_apart
from onboard.rungs.gate_recipe import resolved_device_type, world_size
from titan_core.measure.timing import Comparison, compare
from titan_core import launcher
from titan_core.runtime.argv import LAUNCH
from titan_core.measure.numerics import curve_max_rel, rel
from titan_core.models.model_builder import resolve_model_args

RUNG = "simple_fsdp"
FP32 = "float32"
BF16 = "bfloat16"
PRECISION_LEVER = "training.mixed_precision_param"
RUNS = ("fp32", "bf16", "fsdp2")
"""The three sharded runs, each in runs/.../<name>/."""


def baseline_reason(cfg, evidence: dict) -> str | None:
    """Why the eager evidence is not the baseline of the sharded step-1 numbers (None: it is)."""
    t = cfg.training
    if "eager" not in evidence:
        return "no passed eager evidence to compare with"
    not_fp32 = [k for k in ("dtype", "mixed_precision_param", "mixed_precision_reduce") if getattr(t, k) != FP32]
    if not_fp32:
        return f"the recipe's eager evidence is not fp32 ({', '.join(f'training.{k}' for k in not_fp32)})"
    coef = resolve_model_args(cfg.model).aux_loss_coef
    if coef:
        return (
            f"aux_loss_coef = {coef:g}: the load-balancing loss is computed per forward pass over a rank's rows, "
            "so W ranks equal one process with grad_accum = W, not eager's one big batch"
        )
    # ignored labels (text data) need no reason: the CE is the mean over the global batch's valid tokens
    return None


def sharded_config(base, out_dir: Path, *, world: int, mode: str, param_dtype: str):
    """The eager gate's recipe as one W-rank run: B/W rows per rank, fp32 master weights."""
    cfg = copy.deepcopy(base)
    cfg.training.batch_size = base.training.batch_size // world
    cfg.training.dtype = FP32
    cfg.training.mixed_precision_param = param_dtype
    cfg.training.mixed_precision_reduce = FP32
    p = cfg.parallelism
    p.data_parallel, p.dp_replicate, p.dp_shard, p.tp, p.sequence_parallel = mode, 1, -1, 1, False
    parallel_degrees.share_cores(cfg, world)
    cfg.metrics.output_dir = str(out_dir)
    return cfg


def baseline_config(base, out_dir: Path, *, world: int):
    """One process, one fp32 step over the global batch's rows, as grad_accum = W micro-batches of B/W."""
    cfg = copy.deepcopy(base)
    t = cfg.training
    t.steps, t.batch_size, t.grad_accum = 1, t.batch_size // world, world
    t.dtype = t.mixed_precision_param = t.mixed_precision_reduce = FP32
    # not repeated: micro-batch k holds rows k*B/W..., exactly rank k's rows in the sharded run
    cfg.data.repeat_batch = False
    cfg.metrics.output_dir = str(out_dir)
    return cfg


def _world(ctx: RungContext, cfg, world: int, label: str, *, required: bool) -> tuple[list[dict], str | None]:
    """(rank 0's metric rows, failure or None) of one W-rank run; a required run that fails raises."""
    ctx.log(f"simple_fsdp: {label} on {world} processes -> {cfg.metrics.output_dir}")
    run = launcher.run_world(cfg, world, timeout_s=float(gate_recipe.param(RUNG, "timeout_s")))
    if run.ok:
        return run.metrics, None
    stopped_on_nan = run.metrics and not math.isfinite(run.metrics[-1]["loss"])
    if stopped_on_nan or not required:  # a measurement the gate judges (or one it does not need)
        return run.metrics, run.launch.failure or f"exit code {run.launch.exit_code}"
    raise RuntimeError(f"the {label} run failed: {run.launch.failure}")


def _baseline(ctx: RungContext, base, world: int, why: str | None) -> tuple[float, float]:
    """(step-1 loss, grad norm) the sharded fp32 step must reproduce."""
    if why is None:
        ev = ctx.evidence["eager"]
        return float(ev["step1_loss"]), float(ev["step1_grad_norm"])
    cfg = baseline_config(base, ctx.attempt_dir / "baseline", world=world)
    ctx.log(f"simple_fsdp: baseline = 1 process, grad_accum {world}, fp32, 1 step ({why})")
    rows = titan_core.train.run(cfg).metrics
    record_run(ctx, "simple_fsdp: baseline step", rows, 1)
    return rows[0]["loss"], rows[0]["grad_norm"]


def measure(fp32: list[dict], bf16: list[dict], fsdp2: list[dict], *, baseline: tuple[float, float],
            eager_evidence: dict | None, steps: int) -> SimpleFsdpMeasurements:  # fmt: skip
    """The record's runs part, from rank 0's rows of the three sharded runs (`steps` planned) and the
    baseline step."""
    first = fp32[0]
    worst, worst_step = math.inf, None  # a curve that stopped short (a non-finite loss) is the worst
    if len(bf16) == len(fp32) == steps:
        worst, worst_step = curve_max_rel([r["loss"] for r in bf16], [r["loss"] for r in fp32])
    steady = run_compare.steady(fp32)
    fsdp2_time = run_compare.steady(fsdp2).step_time_median_s if fsdp2 else None
    return SimpleFsdpMeasurements.from_parts(
        steady,
        steps_run=len(fp32),
        bf16_steps_run=len(bf16),
        step1_loss=first["loss"],
        step1_grad_norm=first["grad_norm"],
        baseline_step1_loss=baseline[0],
        baseline_step1_grad_norm=baseline[1],
        step1_loss_rel_err=rel(first["loss"], baseline[0]),
        step1_grad_norm_rel_err=rel(first["grad_norm"], baseline[1]),
        bf16_loss_curve_max_rel=worst,
        bf16_loss_curve_worst_step=worst_step,
        bf16_step_time_median_s=run_compare.steady(bf16).step_time_median_s if bf16 else None,
        fsdp2_step_time_median_s=fsdp2_time,
        bf16_peak_mem_bytes=max((r["peak_mem_bytes"] for r in bf16), default=None),
        fsdp2_peak_mem_bytes=max((r["peak_mem_bytes"] for r in fsdp2), default=None),
        # FSDP2 shards the same way: a different step-1 loss there points at the model, not SimpleFSDP
        fsdp2_step1_loss_rel_err=rel(fsdp2[0]["loss"], first["loss"]) if fsdp2 else None,
        # two launches timed apart: context beside SimpleFSDP, never an interval or a faster / slower
        fsdp2_over_simple_fsdp_step_time=fsdp2_time / steady.step_time_median_s if fsdp2 else ABSENT,
        fsdp2_vs_simple_fsdp_context=(timed_apart(fsdp2_time, steady.step_time_median_s, "SimpleFSDP", "FSDP2")
                                      if fsdp2 else ABSENT),
        eager_step1_loss_rel_err=(rel(first["loss"], float(eager_evidence["step1_loss"]))
                                  if eager_evidence else ABSENT),
        eager_step1_grad_norm_rel_err=(rel(first["grad_norm"], float(eager_evidence["step1_grad_norm"]))
                                       if eager_evidence else ABSENT),
    )  # fmt: skip


def run(ctx: RungContext) -> RungResult:
    base = gate_recipe.job_config(ctx)
    base.training.steps = steps = gate_recipe.param(RUNG, "steps")
    world = checked_world(ctx, base)
    b, why = base.training.batch_size, baseline_reason(base, ctx.evidence)
    ctx.log(
        f"simple_fsdp: world size {world}, {b // world} of {b} rows x {base.training.seq_len} tokens per rank, "
        f"{steps} steps on a repeated batch, device {resolved_device_type(base.device.type)}"
    )
    overrides = gate_recipe.gate_overrides(ctx, base)
    for note in overrides:
        ctx.log(f"simple_fsdp: {note}")
    runs = sharded_runs(ctx, base, world)
    (fp32, _), (bf16, _), (fsdp2, _) = (runs[name] for name in RUNS)
    baseline = _baseline(ctx, base, world, why)
    degrees = parallel_degrees.run(ctx, base)
    sharded = measure(fp32, bf16, fsdp2, baseline=baseline, eager_evidence=ctx.evidence.get("eager"), steps=steps)
    against = "eager evidence" if why is None else f"1 process, grad_accum = {world}, same rows"
    ctx.log(
        f"simple_fsdp: step-1 loss rel {sharded.step1_loss_rel_err:.2e}, grad norm rel "
        f"{sharded.step1_grad_norm_rel_err:.2e} (vs {against}); bf16 curve max rel "
        f"{sharded.bf16_loss_curve_max_rel:.2e}; step time {sharded.step_time_median_s * 1e3:.0f} ms SimpleFSDP"
        + (
            f", {sharded.fsdp2_step_time_median_s * 1e3:.0f} ms FSDP2 ({sharded.fsdp2_vs_simple_fsdp_context})"
            if fsdp2
            else ", FSDP2 failed"
        )
    )
    edits, choices, decisions = recipe_choices(ctx, base, sharded)
    # the record, once: the sharded runs', the degrees' and the choices' parts, and the setting they ran in
    m = SimpleFsdpMeasurements.from_parts(
        sharded, degrees, choices,
        precision=gate_recipe.precision(base.training),
        world_size=world, global_batch_size=b, batch_size_per_rank=b // world,
        baseline=against,
        baseline_why=why or "one sharded step is the same arithmetic as eager's step on the whole batch",
    )  # fmt: skip
    details = {"device": resolved_device_type(base.device.type), "world_size": world, "gate_overrides": overrides,
               "decisions": decisions, **run_details(ctx, runs, world)}  # fmt: skip
    return gate_recipe.result(ctx, base, m, details, edits)


def checked_world(ctx: RungContext, base) -> int:
    """W, once the recipe's batch splits over it (bad input otherwise)."""
    b, world = base.training.batch_size, world_size(base.device.type)
    if b % world:
        raise BadInput(
            f"{ctx.workspace.recipe_path}: training.batch_size = {b} does not split over {world} ranks; the sharded "
            f"run gives each rank batch_size / {world} rows so that together they see the eager rung's global "
            f"batch: use a batch size divisible by {world}"
        )
    return world


def sharded_runs(ctx: RungContext, base, world: int) -> dict[str, tuple[list[dict], str | None]]:
    """{name: (rank 0's rows, failure or None)} of the three sharded runs (RUNS)."""

    def sharded(name: str, mode: str, param_dtype: str, label: str, required: bool = True):
        cfg = sharded_config(base, ctx.attempt_dir / name, world=world, mode=mode, param_dtype=param_dtype)
        rows, failure = _world(ctx, cfg, world, label, required=required)
        if required:  # FSDP2 is timed beside SimpleFSDP, never gated
            record_run(ctx, f"simple_fsdp: {label}", rows, cfg.training.steps)
        return rows, failure

    runs = {
        "fp32": sharded("fp32", "simple_fsdp", FP32, "SimpleFSDP fp32"),
        "bf16": sharded("bf16", "simple_fsdp", "bfloat16", "SimpleFSDP bf16 params / fp32 reduce"),
        # FSDP2 is measured for its step time beside SimpleFSDP's; the gate does not judge it
        "fsdp2": sharded("fsdp2", "fsdp2", FP32, "FSDP2 fp32", required=False),
    }
    if not runs["fp32"][0]:
        raise RuntimeError(f"the SimpleFSDP fp32 run logged no step (metrics: {ctx.attempt_dir / 'fp32'})")
    return runs


def run_details(ctx: RungContext, runs: dict[str, tuple[list[dict], str | None]], world: int) -> dict:
    """The curves, files and reproducing commands of the sharded runs, and each one's failure."""
    out, key = ctx.attempt_dir, ctx.workspace.key_for
    (fp32, _), (bf16, _), (fsdp2, _) = (runs[name] for name in RUNS)
    details = {
        "loss_curve": [r["loss"] for r in fp32],
        "grad_norm_curve": [r["grad_norm"] for r in fp32],
        "bf16_loss_curve": [r["loss"] for r in bf16],
        "fsdp2_loss_curve": [r["loss"] for r in fsdp2],
        "runs": {
            name: {
                "metrics_file": key(out / name / "metrics.jsonl"),
                "rank_logs": key(out / name / "logs"),
                # run_world wrote the resolved recipe there and ran it under torchrun (titan_core's
                # launcher adds only per-rank logs, the hang timeout and dying with its parent)
                "command": f"{' '.join(LAUNCH)} --standalone --nproc-per-node={world} -m titan_core.train "
                f"--config {out / name / 'world_recipe.toml'}",
            }
            for name in RUNS
        },
    }
    for name, (_, failure) in runs.items():
        if failure:  # the run stopped (a non-finite loss, or FSDP2 failing): its rank report
            details[f"{name}_failure"] = failure
    return details


def time_precisions(ctx: RungContext, base, *, candidate: str = BF16, holder: str = FP32) -> Comparison:
    """`candidate` parameters against the `holder` precision, one process, the two Trainers' steps
    interleaved (the timing protocol, `params.timing`): the speed the recipe's own run would see,
    paired so that the machine's drift between two separate runs cannot decide it. The ratio is
    candidate / holder."""
    trainers = {}
    try:
        with train_run.process_threads():
            for dtype in (holder, candidate):
                cfg = copy.deepcopy(base)
                cfg.training.steps, cfg.training.mixed_precision_param = 10_000, dtype
                cfg.training.dtype = cfg.training.mixed_precision_reduce = FP32
                cfg.metrics.output_dir = str(ctx.attempt_dir / f"precision-{dtype}")
                trainers[dtype] = train_run.build_trainer(cfg)
                trainers[dtype].train_step()  # warm-up outside the timed rounds
            proto = timing_profiles.protocol(RUNG, ctx.timing_profile)
            ctx.log(f"simple_fsdp: {candidate} params against {holder}, interleaved steps; timing: {proto.describe_budget()}")
            step = {k: (lambda t=t: t.train_step()["step_time_s"]) for k, t in trainers.items()}
            return compare(step[candidate], step[holder], proto)
    finally:
        for t in trainers.values():
            t.close()


def _untimed(holder: str, candidate: str, value: str, verdict: str, why: str) -> Decision:
    return Decision(rung=RUNG, lever=PRECISION_LEVER, holder=holder, candidate=candidate, value=value,
                    verdict=verdict, figure="none", why=why)  # fmt: skip


def precision_decision(ctx: RungContext, base, m: Mapping[str, Any],
                       timing=None) -> tuple[Decision, Comparison | None]:  # fmt: skip
    """(the Decision of training.mixed_precision_param, the comparison it rests on or None); `m`: the
    sharded runs' measurements (`measure`'s part, or a flat dict of them).

    The holder is the recipe's value, the candidate the other of fp32 / bf16. A recipe whose
    parameters are bf16 (training.dtype) gathers them in bf16, untimed. A bf16 loss curve beyond
    the checklist's bound makes bf16 not eligible, untimed. Otherwise the candidate is timed
    against the holder (`time_precisions`, or `timing` given) and takes the lever only when
    `faster` (`decision.decide`; the checklist asks a clear margin, as the precision changes the
    numerics): indistinguishable, slower or not measured leave the holder standing."""
    recipe = gate_recipe.recipe(ctx)
    holder = recipe.training.mixed_precision_param
    candidate = FP32 if holder == BF16 else BF16
    bound = next(c.threshold for c in gate_recipe.checklist(RUNG).criteria if c.metric == "bf16_loss_curve_max_rel")
    if not m["bf16_loss_curve_max_rel"] <= bound:  # nan too: a curve that is not a number is not within
        left = f"bf16's loss curve left fp32's by more than {bound:g}"
        if holder == BF16:
            return _untimed(holder, FP32, FP32, KEPT, f"{left}: bf16 params are not eligible; float32, untimed"), None
        said = f"{left}: bf16 params are not eligible; {holder} stands"
        return _untimed(holder, BF16, holder, NOT_ELIGIBLE, said), None
    if recipe.training.dtype == BF16:
        # the parameters themselves are bf16: gathering them "in fp32" would only double the bytes moved
        said = "the recipe's parameters are bf16 (training.dtype): gathered as they are, untimed"
        if holder == BF16:
            return _untimed(holder, FP32, BF16, HELD, f"{said}; float32 not eligible"), None
        return _untimed(holder, BF16, BF16, KEPT, said), None
    cmp = timing if timing is not None else time_precisions(ctx, base, candidate=candidate, holder=holder)
    set_by = holder_set_by(ctx.workspace.ledger, PRECISION_LEVER)
    d = decide(RUNG, PRECISION_LEVER, holder=holder, candidate=candidate, comparison=cmp.to_dict(), set_by=set_by,
               what=f"{candidate} params")  # fmt: skip
    return d, cmp


def recipe_choices(ctx: RungContext, base, m: Mapping[str, Any],
                   timing=None) -> tuple[list[RecipeEdit], SimpleFsdpMeasurements, list[dict]]:  # fmt: skip
    """(recipe edits, the record's choices part, decisions) for the two levers this rung measured; `m` as
    `precision_decision` reads it.

    Mixed precision: `precision_decision`; its Decision is the rung's one record of the lever
    (details.decisions). Data parallel: SimpleFSDP stays, whatever FSDP2 measured: it is the path
    the compile and graph_trainer rungs verify (the Graph Trainer captures SimpleFSDP's
    parametrization), so a recipe with FSDP2 would hold a combination no later gate ran; not a
    decision between two timed candidates, so no Decision.
    """
    recipe = gate_recipe.recipe(ctx)
    d, cmp = precision_decision(ctx, base, m, timing)
    ctx.log(f"simple_fsdp: {d.why}")
    why = f"simple_fsdp rung: {d.why}"
    edits = []
    if recipe.training.mixed_precision_param != d.value:
        edits.append(RecipeEdit(PRECISION_LEVER, d.value, why))
    return edits, SimpleFsdpMeasurements(
        mixed_precision_choice=d.value,
        mixed_precision_why=why,
        mixed_precision_timing=cmp.to_dict() if cmp is not None else None,
        data_parallel_choice=recipe.parallelism.data_parallel,
        data_parallel_why=(
            "SimpleFSDP stays: the compile and graph_trainer rungs verify it (FSDP2 measured beside it: "
            f"{m.get('fsdp2_vs_simple_fsdp_context') or 'failed'})"
        ),
    ), [d.to_dict()]
