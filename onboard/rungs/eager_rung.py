"""Rung 1, `eager`: the model trains on the target device at all (DESIGN sections 1 and 5).

It runs the workspace recipe for the checklist's `steps` optimizer steps on one repeated
batch, through titan_core's public `train.run`, and measures what the checklist judges
(finite losses and grad norms, the loss falling, step-1 loss near ln(vocab)) plus the
baseline every later rung compares with: step-1 loss and grad norm as exact repr floats,
and the steady-state step times, tokens/s, MFU and peak memory.

When the recipe starts from a checkpoint (`checkpoint.initial_hf`, which new-model writes for
--weights), step 1's loss must also equal transformers' loss of that checkpoint on the same batch
(onboard/rungs/eager_from_weights.py), and that loss is the step-1 loss to expect.

When the gates run on a twin, the full model of config.json is checked here too, on the
meta device (onboard/rungs/full_model.py): it builds, its parameter counts and FLOPs, its
state-dict names and shapes against the upstream class, and with --weights every
checkpoint tensor from the safetensors headers. The probe runs for every workspace (without
a twin the full model is the one trained), so the ledger always holds the full model's size.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import titan_core.train
from titan_core.models.flux.config import flux_of_args
from onboard.rungs import eager_from_weights, harness
from onboard.rungs.contract import ABSENT, RungContext, RungResult
from onboard.rungs.gated_runs import record_run

RUNG = "eager"
reads_recipe_key = harness.reads_all_but_mode


@dataclass(kw_only=True)
class EagerMeasurements(harness.SteadyRun):
    """The eager rung's measurements: the run on the repeated batch, then the full model on meta."""

    steps_run: int = ABSENT
    """Optimizer steps the run logged (fewer than planned: a non-finite loss stopped it)."""
    steps_planned: int = ABSENT
    """Optimizer steps the gate asked for (checklist `params.steps`)."""
    all_finite: bool = ABSENT
    """Every planned step ran and every loss and grad norm is finite."""
    step1_loss: float = ABSENT
    """Cross-entropy of step 1 (nats per token): the baseline every later rung compares with."""
    step1_loss_repr: str = ABSENT
    """step1_loss as its repr: the exact float, for comparisons bit for bit."""
    step1_grad_norm: float = ABSENT
    """Total gradient L2 norm of step 1, as clipping measured it."""
    step1_grad_norm_repr: str = ABSENT
    """step1_grad_norm as its repr (exact)."""
    last_loss: float = ABSENT
    """Cross-entropy of the last step (nats per token): below step1_loss when the batch is learnt."""
    last_loss_repr: str = ABSENT
    """last_loss as its repr (exact)."""
    vocab_size: int = ABSENT
    """Vocabulary size of the model trained (tokens; a language model's)."""
    ln_vocab: float = ABSENT
    """ln(vocab_size): the loss of a uniform prediction (nats; a language model's)."""
    expected_step1_loss: float = ABSENT
    """What a freshly initialised model's loss should be: ln(vocab) for a language model (a uniform
    prediction), 2.0 for a flow model (its zero-initialised output predicts 0, and the velocity
    target, noise - latents, of unit normals has mean square 2)."""
    expected_step1_loss_is: str = ABSENT
    """Which of the two expected_step1_loss is, in words."""
    step1_loss_rel_to_expected: float = ABSENT
    """|step1_loss - expected_step1_loss| / expected_step1_loss (fraction): how far a fresh model starts from it."""
    num_params: int = ABSENT
    """Parameters of the model trained (the twin's when the gates run on a twin)."""
    # a bf16 recipe's own rounding (`bf16_rounding`): the scale of every later bf16 bound
    fp32_step1_loss_repr: str = ABSENT
    """Step-1 loss of the same recipe, weights and batch computed in fp32 (repr; a bf16 recipe only)."""
    fp32_step1_grad_norm_repr: str = ABSENT
    """Step-1 grad norm of that fp32 step (repr; a bf16 recipe only)."""
    bf16_rounding: float = ABSENT
    """How far bf16 moves this recipe's step 1 from fp32's: the larger of the loss's and the grad
    norm's relative error against the fp32 step (fraction; a bf16 recipe only)."""
    bf16_rounding_bound: float = ABSENT
    """The bound of a bf16 run compared with another of the same recipe: params.bf16_rounding_factor x
    bf16_rounding, never below params.bf16_rounding_floor (fraction; a bf16 recipe only)."""
    # a recipe that starts from checkpoint.initial_hf (onboard/rungs/eager_from_weights.py)
    step1_loss_reference: str = ABSENT
    """What step 1 was compared with: transformers' loss of checkpoint.initial_hf on the same batch, or none."""
    step1_loss_vs_transformers_rel_err: float = ABSENT
    """|ours - transformers'| / transformers' step-1 loss of the checkpoint on the same batch, both fp32 (a bf16
    recipe's fp32 step; fraction); 0.0 without initial_hf (nothing to compare), inf when transformers' loss
    could not be computed (details.step1_vs_transformers.why_not_compared)."""
    step1_loss_compared_repr: str = ABSENT
    """Our fp32 step-1 loss that was compared (repr; with initial_hf)."""
    step1_loss_transformers_repr: str = ABSENT
    """transformers' loss of the checkpoint on the same batch, fp32 (repr; with initial_hf)."""
    # the full model of config.json on the meta device (onboard/rungs/full_model.py)
    full_model_built_on_meta: bool = ABSENT
    """The full-size model builds on meta through the recipe's [model] section and the adapter."""
    full_model_runs_as: str = ABSENT
    """Which model the gates train: the twin (with both shapes) or the full model."""
    full_model_params_total: int = ABSENT
    """Parameters of the full model (count)."""
    full_model_params_active: int = ABSENT
    """Parameters one token uses (count; fewer than the total for a MoE model)."""
    full_model_flops_per_token: float = ABSENT
    """Forward + backward FLOPs per token of the full model at the recipe's seq_len."""
    full_model_seq_len: int = ABSENT
    """The sequence length those FLOPs are counted at (tokens)."""
    full_model_key_mismatches: int = ABSENT
    """State-dict names or shapes that differ from the reference (full_model_keys_reference) (count)."""
    full_model_keys_reference: str = ABSENT
    """What the state dict was compared with: the upstream class on meta, or the adapter's round trip."""
    full_model_tensors: int = ABSENT
    """Tensors of the full model's state dict under HF names (count)."""
    full_model_checkpoint: str = ABSENT
    """The --weights header check in one line ("no --weights given" without one)."""
    full_model_checkpoint_problems: int = ABSENT
    """Checkpoint tensors missing, extra, of the wrong shape or dtype, plus file/index problems (count)."""
    full_model_checkpoint_missing: int = ABSENT
    """Full-model tensors the checkpoint lacks (count)."""
    full_model_checkpoint_extra: int = ABSENT
    """Checkpoint tensors the full model has no place for (count)."""
    full_model_checkpoint_wrong_shape: int = ABSENT
    """Checkpoint tensors of another shape than the full model's (count)."""
    full_model_checkpoint_wrong_dtype: int = ABSENT
    """Checkpoint tensors of another dtype than the declared one (config.json's dtype, else the model's) (count)."""
    full_model_checkpoint_file_problems: int = ABSENT
    """Problems of the files and the index themselves (a shard the index does not list, ...) (count)."""
    full_model_checkpoint_bytes_read: int = ABSENT
    """Bytes of safetensors headers read for the check (bytes)."""
    full_model_checkpoint_bytes_declared: int = ABSENT
    """Tensor data the headers declare (bytes)."""


MEASUREMENTS = EagerMeasurements


FLOW_STEP1_LOSS = 2.0
"""E[(noise - latents)^2] for independent unit-normal noise and latents: a flow model's loss
while its zero-initialised output predicts 0."""


def expected_step1_loss(args) -> tuple[float, str, dict]:
    """(expected step-1 loss, what it is, the language model's vocabulary measurements) for these model args."""
    if flux_of_args(args) is not None:
        return FLOW_STEP1_LOSS, "mean square of the velocity target of unit-normal samples (flow model)", {}
    ln_vocab = math.log(args.vocab_size)
    return ln_vocab, f"ln(vocab {args.vocab_size}), a uniform prediction", {
        "vocab_size": args.vocab_size, "ln_vocab": ln_vocab,
    }  # fmt: skip


def measure(rows: list[dict], args, num_params: int, *, steps: int) -> dict:
    """Gate measurements from the per-step metric rows of one run of `steps` planned steps."""
    losses = [r["loss"] for r in rows]
    norms = [r["grad_norm"] for r in rows]
    first, last = rows[0], rows[-1]
    expected, what, vocab = expected_step1_loss(args)
    return {
        "steps_run": len(rows),
        "steps_planned": steps,
        "all_finite": len(rows) == steps and all(math.isfinite(x) for x in losses + norms),
        "step1_loss": first["loss"],
        "step1_loss_repr": repr(first["loss"]),
        "step1_grad_norm": first["grad_norm"],
        "step1_grad_norm_repr": repr(first["grad_norm"]),
        "last_loss": last["loss"],
        "last_loss_repr": repr(last["loss"]),
        **vocab,
        "expected_step1_loss": expected,
        "expected_step1_loss_is": what,
        "step1_loss_rel_to_expected": abs(first["loss"] - expected) / expected,
        **harness.run_stats(rows),
        "num_params": num_params,
    }


def bf16_rounding(ctx: RungContext, cfg, bf16_row: dict) -> dict:
    """The bf16 recipe's own rounding at step 1: the same step (weights, batch) in fp32, and the bound
    every later comparison of two bf16 runs of this recipe is judged by (checklists: threshold per
    precision). Two bf16 computations of one step each sit about this far from the fp32 value, so
    they differ by up to twice it; what differs by more changed the model, not its rounding."""
    from titan_core.measure.numerics import rel  # lazy: loads torch; onboard status imports the rungs

    ref = copy.deepcopy(cfg)
    t = ref.training
    t.steps, t.dtype, t.mixed_precision_param, t.mixed_precision_reduce = 1, "float32", "float32", "float32"
    ref.metrics.output_dir = str(ctx.attempt_dir / "fp32-reference")
    ctx.log("eager: the recipe computes in bf16; the same step 1 in fp32 measures its own rounding")
    row = titan_core.train.run(ref).metrics[:1]
    if record_run(ctx, "eager: fp32 reference step", row, 1):
        return {}
    fp32 = row[0]
    rounding = max(rel(bf16_row["loss"], fp32["loss"]), rel(bf16_row["grad_norm"], fp32["grad_norm"]))
    bound = max(harness.param(RUNG, "bf16_rounding_floor"), harness.param(RUNG, "bf16_rounding_factor") * rounding)
    ctx.log(f"eager: bf16 moves step 1 by {rounding:.2e} from fp32: bf16 runs of this recipe are compared within {bound:.2e}")
    return {
        "fp32_step1_loss_repr": repr(fp32["loss"]),
        "fp32_step1_grad_norm_repr": repr(fp32["grad_norm"]),
        "bf16_rounding": rounding,
        "bf16_rounding_bound": bound,
    }


def run(ctx: RungContext) -> RungResult:
    from onboard.rungs import full_model  # lazy: loads torch; onboard status imports the rungs

    cfg = harness.job_config(ctx)
    args = harness.model_args(cfg)
    t = cfg.training
    overrides = harness.announce(ctx, cfg, "eager")
    ctx.log(
        f"eager: batch {t.batch_size} x {t.seq_len} tokens, repeated, "
        f"{t.dtype}, device {cfg.device.type}; metrics -> {ctx.attempt_dir / 'metrics.jsonl'}"
    )
    result = titan_core.train.run(cfg)  # looked up per call: a test replaces it
    rows = result.metrics
    if not rows:
        raise RuntimeError("training ran no step")
    record_run(ctx, "eager", rows, t.steps)
    measurements = EagerMeasurements(**measure(rows, args, result.num_params, steps=t.steps),
                                     precision=harness.precision(t))  # fmt: skip
    if measurements.precision == "bf16" and all(math.isfinite(rows[0][k]) for k in ("loss", "grad_norm")):
        measurements.update(bf16_rounding(ctx, cfg, rows[0]))
    ctx.log(
        f"eager: loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} over {len(rows)} steps, "
        f"{measurements.tokens_per_s:,.0f} tokens/s"
    )
    if result.stopped:  # the gate judges the short, non-finite curve; the line says where it broke
        ctx.log(f"eager: {result.stopped}")
    # a run from checkpoint.initial_hf: its step 1 against transformers' loss of the same checkpoint
    from_weights, weights_details = eager_from_weights.step1_vs_transformers(ctx, cfg, args, measurements)
    measurements.update(from_weights)
    full, full_details = full_model.probe(ctx, cfg)  # the full-size model, on meta (a twin trained above)
    measurements.update(full)
    files = harness.files_read(ctx, cfg) + [p.resolve() for p in eager_from_weights.checkpoint_files(cfg)]
    return RungResult(
        measurements=measurements,
        files_read=list(dict.fromkeys(files)),
        command=harness.next_step_command(ctx),
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
            "reproduce": harness.train_command(ctx, ["--data.repeat_batch=true", f"--training.steps={t.steps}"]),
            "model": ctx.workspace.model_label(),
            **weights_details,
            **full_details,
        },
    )
