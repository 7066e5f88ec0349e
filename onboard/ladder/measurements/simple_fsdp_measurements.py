"""The simple_fsdp rung's declared measurements (its checklist judges only these)."""

from __future__ import annotations

from dataclasses import dataclass

from onboard.ladder.contract import ABSENT
from onboard.ladder.measurements.training_measurements import SteadyRun


@dataclass(kw_only=True)
class SimpleFsdpMeasurements(SteadyRun):
    """The simple_fsdp rung's measurements (rank 0's rows); the SteadyRun fields are the fp32 SimpleFSDP run's."""

    world_size: int = ABSENT
    """W: processes of each sharded run."""
    global_batch_size: int = ABSENT
    """Rows of the eager rung's batch, split over the ranks (rows)."""
    batch_size_per_rank: int = ABSENT
    """global_batch_size / W (rows)."""
    steps_run: int = ABSENT
    """Steps the fp32 SimpleFSDP run logged."""
    bf16_steps_run: int = ABSENT
    """Steps the bf16-params run logged (fewer: a non-finite loss stopped it)."""
    step1_loss_repr: str = ABSENT
    """The sharded fp32 step-1 loss, as its repr (nats per token)."""
    step1_grad_norm_repr: str = ABSENT
    """The sharded fp32 step-1 grad norm, as its repr."""
    baseline: str = ABSENT
    """What the step-1 numbers are compared with: "eager evidence", or one process with grad_accum = W."""
    baseline_why: str = ABSENT
    """Why that baseline (module docstring)."""
    baseline_step1_loss_repr: str = ABSENT
    """The baseline's step-1 loss, as its repr."""
    baseline_step1_grad_norm_repr: str = ABSENT
    """The baseline's step-1 grad norm, as its repr."""
    step1_loss_rel_err: float = ABSENT
    """|sharded - baseline| / |baseline| step-1 loss (fraction)."""
    step1_grad_norm_rel_err: float = ABSENT
    """|sharded - baseline| / |baseline| step-1 grad norm (fraction)."""
    bf16_loss_curve_max_rel: float = ABSENT
    """Worst relative distance of the bf16-params loss curve from the fp32 one over the steps
    (fraction; inf when the bf16 run stopped short)."""
    bf16_loss_curve_worst_step: int | None = ABSENT
    """The 1-based step of that worst distance; None when the curves do not line up."""
    bf16_step_time_median_s: float | None = ABSENT
    """Median step time of the bf16-params run (seconds)."""
    bf16_peak_mem_bytes: int | None = ABSENT
    """Peak memory of the bf16-params run (bytes)."""
    fsdp2_step_time_median_s: float | None = ABSENT
    """Median step time of the same steps under FSDP2 (seconds); None: FSDP2 failed (not judged)."""
    fsdp2_peak_mem_bytes: int | None = ABSENT
    """Peak memory of the FSDP2 run (bytes)."""
    fsdp2_step1_loss_rel_err: float | None = ABSENT
    """FSDP2's step-1 loss against SimpleFSDP's (fraction): a difference there points at the model."""
    fsdp2_over_simple_fsdp_step_time: float = ABSENT
    """FSDP2's median step time over SimpleFSDP's (x)."""
    fsdp2_vs_simple_fsdp: str | None = ABSENT
    """The timing protocol's unpaired comparison of the two, in one line."""
    eager_step1_loss_rel_err: float = ABSENT
    """The sharded step-1 loss against the eager evidence (fraction), whatever the baseline."""
    eager_step1_grad_norm_rel_err: float = ABSENT
    """The sharded step-1 grad norm against the eager evidence (fraction)."""
    mixed_precision_choice: str = ABSENT
    """training.mixed_precision_param the recipe keeps: float32 or bfloat16 (`precision_decision`)."""
    mixed_precision_why: str = ABSENT
    """Why: the lever's Decision in one line (details.decisions holds it whole)."""
    mixed_precision_timing: dict | None = ABSENT
    """The candidate precision's params against the holder's (the recipe's), one process, interleaved
    steps (Comparison.to_dict, ratio candidate / holder); None: decided untimed."""
    data_parallel_choice: str = ABSENT
    """parallelism.data_parallel the recipe keeps (SimpleFSDP: the path the later rungs verify)."""
    data_parallel_why: str = ABSENT
    """Why, with what FSDP2 measured beside it."""
