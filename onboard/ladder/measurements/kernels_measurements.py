"""What the kernels rung measures (`KernelsMeasurements`): its declaration, read by the ladder
without importing the rung (onboard/rungs/kernels_rung/rung.py builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onboard.ladder.contract import ABSENT, GatedRuns, flattened


@dataclass(kw_only=True)
class KernelsMeasurements(GatedRuns):
    """The kernels rung's measurements: counts and worst errors over every kernel that applies, one
    group of numbers per kernel flag, and the setting they were measured in."""

    kernels_considered: int = ABSENT
    """Kernel flags titan_core knows (count)."""
    kernels_applicable: int = ABSENT
    """Those that apply to this model on this device (count)."""
    kernels_compared: int = ABSENT
    """Those compared with their plain path to the end (count)."""
    kernels_raised: int = ABSENT
    """Those that apply but raised in the comparison or the timed step (count)."""
    kernels_not_applicable: int = ABSENT
    """Those that do not apply, each with its reason (count)."""
    worst_loss_rel_err: float | None = ABSENT
    """Worst relative error of the loss with a kernel against the plain path (fraction; inf: it raised)."""
    worst_loss_kernel: str | None = ABSENT
    """The kernel flag with that worst loss error."""
    worst_logits_rel_err: float | None = ABSENT
    """Worst relative L2 error of the logits (fraction)."""
    worst_logits_kernel: str | None = ABSENT
    """The kernel flag with that worst logits error."""
    worst_grad_rel_err: float | None = ABSENT
    """Worst relative L2 error of a parameter's gradient against the plain path's, both fp32 (fraction),
    over the gradients not excused as fp32 rounding (grads_excused_as_rounding)."""
    worst_grad_kernel: str | None = ABSENT
    """The kernel flag with that worst gradient error."""
    worst_grad_param: str | None = ABSENT
    """The parameter of that worst gradient."""
    grads_excused_as_rounding: int = ABSENT
    """Gradients over the tolerance that the fp64 check showed to be fp32 rounding (count, over every
    kernel): the plain path run in fp64, the kernel's gradient is within params.grad_rounding_factor x
    the plain path's own fp32 error of it. Each kernel's row lists them with both errors (fp64_check)."""
    worst_kernel: str | None = ABSENT
    """The kernel flag with the worst error of any kind (the fp32 comparisons; float8 below)."""
    float8_checked: int = ABSENT
    """kernels.float8 recipes (tensorwise, rowwise) checked against the bf16 recipe (count; the others
    do not apply here, each with its reason under <short>_not_applicable)."""
    float8_loss_rel_bound: float = ABSENT
    """The bound of that check's loss: titan_core.kernels.float8.FLOAT8_LOSS_REL (fraction), read there."""
    worst_float8_loss_rel: float = ABSENT
    """Worst over the float8 recipes checked of the largest |loss - bf16 loss| / bf16 loss over the
    gate's recipe steps (params.float8_steps), both runs in bf16 (fraction; inf: it raised; 0 when no
    float8 recipe applies)."""
    worst_float8_loss_kernel: str | None = ABSENT
    """The float8 flag with that worst loss error."""
    worst_float8_layer_over_bound: float = ABSENT
    """Worst over the float8 recipes checked and their converted linears of the output or gradient
    relative L2 error against the bf16 nn.Linear as a fraction of its documented bound
    (FLOAT8_OUTPUT_REL_L2 / FLOAT8_GRAD_REL_L2 of the recipe): within at <= 1 (inf: it raised; 0 when
    no float8 recipe applies)."""
    worst_float8_layer_kernel: str | None = ABSENT
    """The float8 flag with that worst layer error."""
    per_kernel: dict[str, Any] = flattened()
    """Per kernel flag, under its short name (loss_fused_ce, attention_sdpa, ...): <short>_max_rel_err
    (against the plain path, fp32); for a kernel timed as a candidate, against the value the recipe
    held (<short>_timed_against): <short>_time_ratio (its whole step's time / the holder's, x),
    <short>_time_ratio_ci, <short>_timing (the protocol's outcome), <short>_memory_saving (fraction of
    the holder's fp32 step peak; None: not measured); <short>_kept (the recipe holds it after this
    rung); or <short>_not_applicable (why). A float8 recipe (float8_tensorwise, float8_rowwise) has
    no fp32 error but its check against the bf16 recipe: <short>_loss_rel, <short>_loss_bound,
    <short>_layer_output_rel / _bound, <short>_layer_grad_rel / _bound, <short>_layers_converted,
    <short>_layers_unconverted (details.kernels.<flag> lists the linears, and why each one left as it is)."""
    compare_dtype: str = ABSENT
    """dtype of the comparison (float32)."""
    compare_batch_size: int = ABSENT
    compare_seq_len: int = ABSENT
    """Rows and tokens per row of the fp32 comparison."""
    compare_shape_why: str = ABSENT
    """Why that shape (the recipe's, or capped at params.compare_max_tokens)."""
    measure_batch_size: int = ABSENT
    measure_seq_len: int = ABSENT
    """Rows and tokens per row of the timed whole training steps (the recipe's)."""
    timing_protocol: dict = ABSENT
    """The timing protocol every keep decision's whole steps were timed with (checklist params.timing)."""
    recipe_dtype: str = ABSENT
    """The dtype the recipe computes in: it decides which kernels can run."""
    captured: bool = ABSENT
    """The recipe trains in a captured mode (compile or graph_trainer): each kernel is checked there too."""
    execution_mode: str = ABSENT
    """The recipe's execution mode: eager, compile or graph_trainer."""
    whole_step_trainers: int = ABSENT
    """Trainers of the recipe (one kernels value each) built to time whole steps (count)."""
    proposed_recipe_edits: list[str] = ABSENT
    """The recipe edits the keep rule picked, each as "key=value" (written only if the gate passes)."""
    recipe_steps_run: int = ABSENT
    """Steps the recipe as the rung leaves it (its edits applied, its execution mode and precision)
    logged in its one whole run (params.recipe_steps planned; runs_whole judges it)."""
    recipe_loss_curve: list[float] = ABSENT
    """That run's loss per step."""
