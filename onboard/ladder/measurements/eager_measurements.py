"""The eager rung's declared measurements (its checklist judges only these)."""

from __future__ import annotations

from dataclasses import dataclass

from onboard.ladder.contract import ABSENT
from onboard.ladder.measurements.training_measurements import SteadyRun


@dataclass(kw_only=True)
class EagerMeasurements(SteadyRun):
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
