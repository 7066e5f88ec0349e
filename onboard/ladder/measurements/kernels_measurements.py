"""What the kernels rung measures (`KernelsMeasurements`): its declaration, read by the ladder
without importing the rung (onboard/rungs/kernels_rung.py fills it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onboard.ladder.contract import ABSENT, flattened
from onboard.ladder.gated_runs import GatedRuns


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
    """The kernel flag with the worst error of any kind."""
    per_kernel: dict[str, Any] = flattened()
    """Per kernel flag, under its short name (loss_fused_ce, attention_sdpa, ...): <short>_max_rel_err
    (against the plain path, fp32); for a kernel timed as a candidate, against the value the recipe
    held (<short>_timed_against): <short>_time_ratio (its whole step's time / the holder's, x),
    <short>_time_ratio_ci, <short>_timing (the protocol's outcome), <short>_memory_saving (fraction of
    the holder's fp32 step peak; None: not measured); <short>_kept (the recipe holds it after this
    rung); or <short>_not_applicable (why)."""
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
