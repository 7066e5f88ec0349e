"""The graph_trainer rung's declared measurements (its checklist judges only these)."""

from __future__ import annotations

from dataclasses import dataclass

from onboard.ladder.contract import ABSENT, flattened
from onboard.ladder.measurements.training_measurements import ModeRun


@dataclass(kw_only=True)
class GraphTrainerMeasurements(ModeRun):
    """The graph_trainer rung's measurements, part by part (module docstring); the ModeRun fields
    are the timed run's (part 3)."""

    # 1. probe: tracing only
    captured: bool = ABSENT
    """make_fx traced the whole step (and, in part 2, the captured run ran)."""
    capture_error: str = ABSENT
    """Why it could not be traced or captured (only when captured is false)."""
    host_syncs: int = ABSENT
    """Places where the traced step makes the host wait for the device (count)."""
    first_host_sync: str | None = ABSENT
    """The first of them: "<op>: <why> at <file:line>"; None: none."""
    saved_activations: dict[str, int] = flattened()
    """saved_activation_bytes_<policy> (and saved_activation_host_bytes_<policy> where a policy offloads):
    the activations the captured step saves for backward under each memory policy (bytes)."""
    # 2. exactness: eager and the captured step, uncompiled, deterministic
    captures_per_run: int = ABSENT
    """Times the step was traced in the exactness run (count; 1: traced once, then replayed)."""
    graphs_per_step: int = ABSENT
    """Most programs launched by one step of the exactness run (count; 1: the whole step is one graph)."""
    exact_steps: int = ABSENT
    """Steps of the exactness run (checklist `params.exact_steps`)."""
    bit_identical: bool = ABSENT
    """Losses, grad norms, parameters and AdamW state all torch.equal to eager's, over as many steps."""
    exact_rel_err: float = ABSENT
    """How far the captured run is from eager's: 0.0 exactly when bit_identical, else the worst relative
    error over every step's loss and grad norm and every parameter after the last step (rel L2)
    (fraction; inf for a difference none of those measures, a NaN or a run of another length)."""
    losses_equal: bool = ABSENT
    """Every step's loss equal to eager's (as floats)."""
    grad_norms_equal: bool = ABSENT
    """Every step's grad norm equal to eager's."""
    params_equal: bool = ABSENT
    """Every parameter torch.equal to eager's after the last step."""
    optimizer_state_equal: bool = ABSENT
    """Every exp_avg, exp_avg_sq and step torch.equal to eager's."""
    loss_max_abs_diff: float = ABSENT
    """Largest |captured - eager| loss over the steps (nats per token)."""
    params_max_abs_diff: float = ABSENT
    """Largest absolute difference of any parameter element after the last step."""
    first_differing_param: str | None = ABSENT
    """The parameter with that largest difference; None: all equal."""
    eager_step1_loss_rel_err: float = ABSENT
    """The captured step-1 loss against the eager rung's evidence (relative, fraction)."""
    # 3. speed: the recipe's own [graph_trainer] settings
    graph_compile: str = ABSENT
    """The recipe's graph_trainer.compile (the backend of the timed run)."""
    memory_policy: str = ABSENT
    """The recipe's graph_trainer.memory_policy."""
    scan_layers: bool = ABSENT
    """The recipe's graph_trainer.scan_layers."""
    split: bool = ABSENT
    """The recipe's graph_trainer.split."""
    timed_programs_per_step: int = ABSENT
    """Most programs launched by one step of the timed run (count; > 1 with split)."""
    trace_time_s: float = ABSENT
    """Seconds make_fx spent tracing the step (timed run)."""
    passes_time_s: float = ABSENT
    """Seconds the graph passes took (timed run)."""
    backend_compile_time_s: float = ABSENT
    """Seconds the backend compiler took (timed run); compile_time_s is the three together."""
    compile_rung_step_time_median_s: float = ABSENT
    """The compile rung's median step time (seconds), where it passed."""
    speedup_vs_compile_rung: float = ABSENT
    """The compile rung's median step time over the timed run's (x; > 1: the Graph Trainer is faster)."""
    # 4. the choice, once parts 1 and 2 hold
    execution_mode: str = ABSENT
    """The mode the recipe trains in from now on: eager, compile or graph_trainer."""
    execution_mode_why: str = ABSENT
    """Why: the timing protocol's verdicts (details.execution_mode has each comparison)."""
    memory_policy_choice: str = ABSENT
    """The memory policy the recipe keeps (its own: the gate's batch binds no memory budget)."""
    memory_policy_why: str = ABSENT
    """Why, with the saved activations per policy."""
