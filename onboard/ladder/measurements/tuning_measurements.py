"""What the tuning rung measures (`TuningMeasurements`): its declaration, read by the ladder
without importing the rung (onboard/rungs/tuning_rung.py fills it)."""

from __future__ import annotations

from dataclasses import dataclass

from onboard.ladder.contract import ABSENT
from onboard.ladder.measurements.training_measurements import BesideEager


@dataclass(kw_only=True)
class TuningMeasurements(BesideEager):
    """The tuning rung's measurements; the BesideEager fields are the final recipe's whole run's."""

    # every change tried (details.changes has each one)
    changes_tried: int = ABSENT
    """Changes classified (and, unless rejected, timed) against the recipe they would change (count)."""
    changes_kept: int = ABSENT
    """Those kept (count)."""
    kept_changes: list[str] = ABSENT
    """Each kept change with its numerics class, e.g. "ce_chunk=2048 (bit_identical)"."""
    kept_unmeasured: int = ABSENT
    """Kept changes with no timing or no bit_identical / rounding class (count; must be 0)."""
    kept_diverged: int = ABSENT
    """Kept changes classed diverged (count; must be 0)."""
    kept_rounding_without_curve: int = ABSENT
    """Kept rounding changes without a passing loss-curve check (count; must be 0)."""
    untuned_values: dict = ABSENT
    """{recipe key: value} of every tuned key before the rung."""
    final_values: dict = ABSENT
    """{recipe key: value} of every tuned key in the final recipe."""
    # the final recipe against the untuned one, then run whole
    final_recipe: str = ABSENT
    """Label of the final recipe (the last kept change's, or "untuned")."""
    final_class: str = ABSENT
    """Numerics class of the final recipe against the untuned one: bit_identical, rounding or diverged."""
    final_baseline: str = ABSENT
    """Label of the untuned recipe it was classified against (accumulated to the same rows per step)."""
    final_baseline_why: str = ABSENT
    """Why that baseline."""
    final_step1_loss_rel_err: float = ABSENT
    """Step-1 loss, final against untuned, relative (fraction)."""
    final_step1_grad_norm_rel_err: float = ABSENT
    """Step-1 grad norm, final against untuned, relative (fraction)."""
    final_step1_loss_repr: str = ABSENT
    final_step1_grad_norm_repr: str = ABSENT
    """The final recipe's step-1 loss and grad norm, as reprs."""
    untuned_step1_loss_repr: str = ABSENT
    untuned_step1_grad_norm_repr: str = ABSENT
    """The baseline's step-1 loss and grad norm, as reprs."""
    step1_loss_repr: str | None = ABSENT
    """Step-1 loss of the final recipe's whole run (Trainer.train), as its repr; None: it ran no step."""
    final_run_whole: bool = ABSENT
    """The whole run did every planned step with finite losses and grad norms, and was not stopped."""
    final_steps_run: int = ABSENT
    """Steps the whole run logged (params.final_steps planned)."""
    # the batch the final recipe runs
    batch_size: int = ABSENT
    """The final recipe's training.batch_size (rows per micro-batch)."""
    grad_accum: int = ABSENT
    """Its training.grad_accum (micro-batches per optimizer step)."""
    global_batch_size: int = ABSENT
    """batch_size x grad_accum (rows per optimizer step)."""
    seq_len: int = ABSENT
    """Tokens per row."""
    batch_stopped: str = ABSENT
    """What ended the batch search: memory, throughput, grid, global_batch or rejected."""
    batch_why: str = ABSENT
    """The batch search's reason, one line."""
    fixed_global_batch: bool = ABSENT
    """The recipe sets training.grad_accum, so its global batch was held fixed."""
    memory_budget_bytes: int = ABSENT
    """The memory the batch search could use, this process's holding included (bytes)."""
    memory_budget_source: str = ABSENT
    """Where that budget comes from (titan_core.memory.budget), or why none is known."""
    # the profile of the final recipe
    profiled: bool = ABSENT
    """torch.profiler ran over params.profile_steps steady steps of the final recipe."""
    profile_biggest: str | None = ABSENT
    """The category that took the most of a step (matmul, attention, norms_elementwise, ...)."""
    profile_lever: str | None = ABSENT
    """What the optimisation handbook points to for that category."""
    profile_sum_rel_err: float | None = ABSENT
    """How far the categories plus host gaps are from the step time measured outside the profiler (fraction)."""
    profile_within_tolerance: bool = ABSENT
    """profile_sum_rel_err within params.profile_sum_tolerance."""
    profile_trace: str | None = ABSENT
    """Workspace key of the profiler's trace.json."""
    timing_protocol: dict = ABSENT
    """The timing protocol every keep decision used (checklist params.timing)."""
    device_kind: str = ABSENT
    """cpu, cuda or tpu: which block-size grid, batch cap and flag table applied."""
    # beside eager, and what the recipe becomes
    eager_tokens_per_s: float | None = ABSENT
    """The eager rung's throughput (tokens per second)."""
    tokens_per_s_vs_eager: float | None = ABSENT
    """The final run's throughput over eager's (x), once the batch changed: two runs timed apart, so
    no interval and not a decision (details.decisions holds what the rung decided by)."""
    proposed_recipe_edits: list[str] = ABSENT
    """The recipe edits, each as "key=value" (written only if the gate passes)."""
    flags: list[str] = ABSENT
    """The `onboard train` flags the final run had on top of the recipe as it was."""
    execution_mode: str = ABSENT
    """The recipe's execution mode the rung tuned in: eager, compile or graph_trainer."""
