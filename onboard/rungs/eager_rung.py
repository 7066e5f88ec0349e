"""Rung 1, `eager`: the model trains on the target device at all (DESIGN sections 1 and 5).

It runs the workspace recipe for the checklist's `steps` optimizer steps on one repeated
batch, through titan_core's public `train.run`, and measures what the checklist judges
(finite losses and grad norms, the loss falling, step-1 loss near ln(vocab)) plus the
baseline every later rung compares with: step-1 loss and grad norm (exact floats: JSON keeps them),
and the steady-state step times, tokens/s, MFU and peak memory. A recipe that starts from a
checkpoint is also held to transformers' loss of it (eager_from_weights.py), and the full model
of config.json is checked on the meta device for every workspace (full_model.py), so the ledger
always holds the full model's size.

Its gate is checklists/eager.yaml; what it measures is EagerMeasurements
(onboard/ladder/measurements/training_measurements.py), built once at the end of `run` from the parts
its steps measured: the run's (`measure`), a bf16 recipe's rounding (`bf16_rounding`), the checkpoint's
(eager_from_weights.py) and the full model's (full_model.py).
"""

from __future__ import annotations

import copy
import math

import titan_core.train
from onboard.rungs import eager_from_weights, full_model, gate_recipe, run_compare
from onboard.ladder.measurements.training_measurements import EagerMeasurements
from onboard.ladder.contract import ABSENT, RungContext, RungResult, record_run
from titan_core.measure.numerics import rel

RUNG = "eager"


def expected_step1_loss(args) -> tuple[float, str, dict]:
    """(expected step-1 loss, what it is, the numbers it is computed from: a language model's vocab_size
    and ln_vocab) for these model args: the model's own `initial_loss` (titan_core/models/common/kind.py)."""
    first = args.initial_loss()
    return first.value, first.what, dict(first.basis)


def measure(rows: list[dict], args, num_params: int, *, steps: int,
            checked: EagerMeasurements | None = None) -> EagerMeasurements:  # fmt: skip
    """The run's part of the record, from the per-step metric rows of one run of `steps` planned steps.
    `checked`: the part `eager_from_weights.step1_vs_transformers` returned; where transformers scored the
    checkpoint, its loss is what step 1 should be, not the model's initial loss."""
    losses = [r["loss"] for r in rows]
    norms = [r["grad_norm"] for r in rows]
    first, last = rows[0], rows[-1]
    expected, what, basis = expected_step1_loss(args)
    if checked is not None and (theirs := eager_from_weights.checked_expected(checked)) is not None:
        expected, what = theirs, eager_from_weights.EXPECTED_IS
    return EagerMeasurements.from_parts(
        run_compare.steady(rows),
        steps_run=len(rows),
        steps_planned=steps,
        all_finite=len(rows) == steps and all(math.isfinite(x) for x in losses + norms),
        step1_loss=first["loss"],
        step1_grad_norm=first["grad_norm"],
        last_loss=last["loss"],
        # a language model's (titan_core's InitialLoss.basis); a flow model's constant has none
        vocab_size=basis.get("vocab_size", ABSENT),
        ln_vocab=basis.get("ln_vocab", ABSENT),
        expected_step1_loss=expected,
        expected_step1_loss_is=what,
        step1_loss_rel_to_expected=rel(first["loss"], expected),
        num_params=num_params,
    )


def bf16_rounding(ctx: RungContext, cfg, bf16_row: dict) -> EagerMeasurements:
    """The bf16 recipe's own rounding at step 1 (the record's fp32_step1_* and bf16_rounding* part; empty
    where the fp32 step was not whole): the same step (weights, batch) in fp32, and the bound every later
    comparison of two bf16 runs of this recipe is judged by (checklists: threshold per precision). Two
    bf16 computations of one step each sit about this far from the fp32 value, so they differ by up to
    twice it; what differs by more changed the model, not its rounding."""
    ref = copy.deepcopy(cfg)
    t = ref.training
    t.steps, t.dtype, t.mixed_precision_param, t.mixed_precision_reduce = 1, "float32", "float32", "float32"
    ref.metrics.output_dir = str(ctx.attempt_dir / "fp32-reference")
    ctx.log("eager: the recipe computes in bf16; the same step 1 in fp32 measures its own rounding")
    row = titan_core.train.run(ref).metrics[:1]
    if record_run(ctx, "eager: fp32 reference step", row, 1):
        return EagerMeasurements()
    fp32 = row[0]
    rounding = max(rel(bf16_row["loss"], fp32["loss"]), rel(bf16_row["grad_norm"], fp32["grad_norm"]))
    floor, factor = gate_recipe.param(RUNG, "bf16_rounding_floor"), gate_recipe.param(RUNG, "bf16_rounding_factor")
    bound = max(floor, factor * rounding)
    ctx.log(f"eager: bf16 moves step 1 by {rounding:.2e} from fp32: bf16 runs of this recipe are compared "
            f"within {bound:.2e}")
    return EagerMeasurements(fp32_step1_loss=fp32["loss"], fp32_step1_grad_norm=fp32["grad_norm"],
                             bf16_rounding=rounding, bf16_rounding_bound=bound)  # fmt: skip


def _checkpoint_refused(ctx: RungContext, cfg, full: EagerMeasurements, full_details: dict) -> RungResult:
    """The attempt of a --weights checkpoint whose headers do not fit the full model: nothing trained, the
    gate fails on full_model_checkpoint_matches (the training criteria are not measured)."""
    why = (f"the --weights checkpoint does not fit the model ({full.full_model_checkpoint}): the model was "
           "not trained; details.full_model.checkpoint names each tensor")  # fmt: skip
    ctx.log(f"eager: {why}")
    return RungResult(
        measurements=EagerMeasurements.from_parts(full, precision=gate_recipe.precision(cfg.training)),
        files_read=gate_recipe.files_read(ctx, cfg) + [p.resolve() for p in eager_from_weights.checkpoint_files(cfg)],
        command=gate_recipe.next_step_command(ctx),
        details={"not_trained": why, "model": ctx.workspace.model_label(), **full_details},
    )


def run(ctx: RungContext) -> RungResult:
    cfg = gate_recipe.job_config(ctx)
    args = gate_recipe.model_args(cfg)
    t = cfg.training
    precision = gate_recipe.precision(t)
    overrides = gate_recipe.announce(ctx, cfg, "eager")
    # the full model on meta and the --weights headers first: a checkpoint that does not fit the model is
    # said in seconds, before minutes of training the twin
    full, full_details = full_model.probe(ctx, cfg)
    if full.full_model_checkpoint_problems not in (ABSENT, 0):
        return _checkpoint_refused(ctx, cfg, full, full_details)
    ctx.log(
        f"eager: batch {t.batch_size} x {t.seq_len} tokens, repeated, "
        f"{t.dtype}, device {cfg.device.type}; metrics -> {ctx.attempt_dir / 'metrics.jsonl'}"
    )
    result = titan_core.train.run(cfg)  # looked up per call: a test replaces it
    rows = result.metrics
    if not rows:
        raise RuntimeError("training ran no step")
    record_run(ctx, "eager", rows, t.steps)
    rounding = EagerMeasurements()
    if precision == "bf16" and all(math.isfinite(rows[0][k]) for k in ("loss", "grad_norm")):
        rounding = bf16_rounding(ctx, cfg, rows[0])
    ctx.log(
        f"eager: loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} over {len(rows)} steps, "
        f"{run_compare.steady(rows).tokens_per_s:,.0f} tokens/s"
    )
    if result.stopped:  # the gate judges the short, non-finite curve; the line says where it broke
        ctx.log(f"eager: {result.stopped}")
    # a run from checkpoint.initial_hf: its step 1 against transformers' loss of the same checkpoint
    checked, weights_details = eager_from_weights.step1_vs_transformers(ctx, cfg, args, step1_loss=rows[0]["loss"],
                                                                        rounding=rounding)  # fmt: skip
    # the record, once: the run's part, the bf16 rounding, the checkpoint's and the full model's (on meta)
    measurements = EagerMeasurements.from_parts(
        measure(rows, args, result.num_params, steps=t.steps, checked=checked), rounding, checked, full,
        precision=precision,
    )
    files = gate_recipe.files_read(ctx, cfg) + [p.resolve() for p in eager_from_weights.checkpoint_files(cfg)]
    return RungResult(
        measurements=measurements,
        files_read=list(dict.fromkeys(files)),
        command=gate_recipe.next_step_command(ctx),
        details={
            "device": result.device,
            "loss_curve": [r["loss"] for r in rows],
            "grad_norm_curve": [r["grad_norm"] for r in rows],
            "batch_size": t.batch_size,
            "seq_len": t.seq_len,
            "dtype": t.dtype,
            "flops_per_token": result.flops_per_token,
            "swaps": dict(result.swaps),
            "model_notes": result.model_notes,
            "metrics_file": ctx.workspace.key_for(ctx.attempt_dir / "metrics.jsonl"),
            "gate_overrides": overrides,
            "stopped": result.stopped,
            "reproduce": gate_recipe.train_command(ctx, ["--data.repeat_batch=true", f"--training.steps={t.steps}"]),
            "model": ctx.workspace.model_label(),
            **weights_details,
            **full_details,
        },
    )
