"""What each rung that trains measures (eager, simple_fsdp, compile, graph_trainer, tuning), on the
shared parts of a run: its steady window's speed and memory (SteadyRun), the same beside the eager
rung's evidence (BesideEager), and a run in another execution mode (ModeRun). Declarations only:
each rung builds its record once, by keyword (`Measurements.from_parts`; onboard/rungs/run_compare.py
builds the shared parts)."""

from __future__ import annotations

from dataclasses import dataclass

from onboard.ladder.contract import ABSENT, GatedRuns, flattened


@dataclass(kw_only=True)
class SteadyRun(GatedRuns):
    """The speed and memory of one run's steady window (run_compare.steady: titan_core.measure.run_stats.RunStats)."""

    steady_from: int = ABSENT
    """1-based step where the steady window starts (1: the run was too short to leave any out)."""
    step_time_median_s: float = ABSENT
    """Median wall time of one optimizer step over the steady window (seconds)."""
    step_time_spread: float = ABSENT
    """Interquartile range of the steady step times over their median (fraction; 0 with one step)."""
    tokens_per_s: float = ABSENT
    """Median training throughput over the steady window (tokens per second, every data-parallel rank's)."""
    mfu: float = ABSENT
    """Median model FLOPs utilisation over the steady window (fraction of the device's peak; on CPU
    against the best matmul rate seen on this machine: indicative)."""
    peak_mem_bytes: int = ABSENT
    """Most device memory any step reached (bytes)."""
    step_times_s: list[float] = ABSENT
    """The steady window's step times (seconds): what another run's times are compared with."""


@dataclass(kw_only=True)
class BesideEager(SteadyRun):
    """A run's speed and memory beside the eager rung's evidence (`beside_eager`)."""

    eager_step_time_median_s: float | None = ABSENT
    """The eager rung's median step time (seconds); None without eager evidence."""
    eager_peak_mem_bytes: int | None = ABSENT
    """The eager rung's peak memory (bytes); None without eager evidence."""
    speedup_vs_eager: float = ABSENT
    """Eager's median step time over this run's (x; above 1 this run's steps took less time): context,
    two runs timed apart, so no interval and not a decision (vs_eager_context says it in words)."""
    vs_eager_context: str = ABSENT
    """The two median step times and their ratio in one line, labelled context (gates.timed_apart),
    e.g. "context (timed apart, no interval): median step 41 ms against eager's 63 ms, 1.54x"."""
    peak_mem_vs_eager: float = ABSENT
    """This run's peak memory over eager's (x; < 1: it uses less)."""


@dataclass(kw_only=True)
class ModeRun(BesideEager):
    """A run of the recipe in another execution mode (compile, graph_trainer)."""

    moe_experts: str | None = ABSENT
    """The kernels.moe the run used (`capture_moe`); None for a dense model."""
    moe_why: str = ABSENT
    """Why those experts (the recipe's loop syncs the host; or the recipe's choice is kept)."""
    flags: str = ABSENT
    """The `onboard train` flags the run verified, space-separated (e.g. "--compile.enable=true")."""
    compile_time_s: float = ABSENT
    """Seconds spent compiling (and, for the Graph Trainer, tracing and passes), paid on the first step."""
    first_step_time_s: float = ABSENT
    """Wall time of step 1, compile included (seconds)."""


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
    """Cross-entropy of step 1 (nats per token): the baseline every later rung compares with, bit for bit
    (the ledger's JSON keeps a float exactly)."""
    step1_grad_norm: float = ABSENT
    """Total gradient L2 norm of step 1, as clipping measured it."""
    last_loss: float = ABSENT
    """Cross-entropy of the last step (nats per token): below step1_loss when the batch is learnt."""
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
    fp32_step1_loss: float = ABSENT
    """Step-1 loss of the same recipe, weights and batch computed in fp32 (nats per token; a bf16 recipe only)."""
    fp32_step1_grad_norm: float = ABSENT
    """Step-1 grad norm of that fp32 step (a bf16 recipe only)."""
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
    step1_loss_compared: float = ABSENT
    """Our fp32 step-1 loss that was compared (nats per token; with initial_hf)."""
    step1_loss_transformers: float = ABSENT
    """transformers' loss of the checkpoint on the same batch, fp32 (nats per token; with initial_hf; nan when
    it could not be computed)."""
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
    step1_loss: float = ABSENT
    """The sharded fp32 step-1 loss (nats per token)."""
    step1_grad_norm: float = ABSENT
    """The sharded fp32 step-1 grad norm."""
    baseline: str = ABSENT
    """What the step-1 numbers are compared with: "eager evidence", or one process with grad_accum = W."""
    baseline_why: str = ABSENT
    """Why that baseline (onboard/rungs/simple_fsdp_rung.py)."""
    baseline_step1_loss: float = ABSENT
    """The baseline's step-1 loss (nats per token)."""
    baseline_step1_grad_norm: float = ABSENT
    """The baseline's step-1 grad norm."""
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
    """FSDP2's median step time over SimpleFSDP's (x): context, two runs timed apart, not a decision."""
    fsdp2_vs_simple_fsdp_context: str | None = ABSENT
    """The two median step times side by side, labelled context (gates.timed_apart: no interval, no
    outcome); None: FSDP2 failed."""
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
    parallel_degrees_needed: list[str] = ABSENT
    """The recipe's degrees above 1 the rung proved at 2 ("ep", "cp", "pp"), and their combination when it
    asks more than one (e.g. "cp+ep"); [] when it asks none (onboard/rungs/parallel_degrees.py)."""
    parallel_degrees: dict = ABSENT
    """{degree: its proof}: the run's degrees and world size, what the recipe asks, the notes (what the proof
    changed from the recipe), titan_core's refusal or the failure, the losses' and grad norms' max relative
    error against one process on the same rows, the worst step, proved or not."""
    parallel_degrees_max_rel_err: float = ABSENT
    """The worst relative error of any needed degree's losses or grad norms against one process, fp32, over
    every step (fraction; inf: a degree refused or stopped; 0.0 when none is needed)."""
    parallel_degrees_unproved: int = ABSENT
    """Needed degrees not within the bound: refused by titan_core, stopped, or off by more (count)."""
    parallel_degrees_unproved_why: list[str] = ABSENT
    """One line per unproved degree: titan_core's refusal, the failure, or the distance and bound."""


@dataclass(kw_only=True)
class CompileMeasurements(ModeRun):
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
    step1_loss: float = ABSENT
    """The compiled step-1 loss (nats per token)."""
    baseline_step1_loss: float = ABSENT
    """The eager rung's step-1 loss it is compared with (nats per token)."""
    step1_loss_rel_err: float = ABSENT
    """|compiled - eager| / |eager| step-1 loss (fraction): rounding only, or a compile that changes the model."""
    last_loss_rel_vs_eager: float | None = ABSENT
    """The same at the last step (rounding compounds over the steps: shown, not judged); None when
    eager ran another number of steps."""
    backend: str = ABSENT
    """The recipe's compile.backend (inductor, aot_eager, ...)."""
    fullgraph: bool = ABSENT
    """The recipe's compile.fullgraph."""


@dataclass(kw_only=True)
class GraphTrainerMeasurements(ModeRun):
    """The graph_trainer rung's measurements, part by part (onboard/rungs/graph_trainer_rung.py); the
    ModeRun fields are the timed run's (part 3)."""

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
    """The compile rung's median step time over the timed run's (x; above 1 the Graph Trainer's steps took
    less time): context, two runs timed apart, no interval and not a decision (execution_mode is that)."""
    # 4. the choice, once parts 1 and 2 hold
    execution_mode: str = ABSENT
    """The mode the recipe trains in from now on: eager, compile or graph_trainer."""
    execution_mode_why: str = ABSENT
    """Why: the timing protocol's verdicts (details.execution_mode has each comparison)."""
    memory_policy_choice: str = ABSENT
    """The memory policy the recipe keeps (its own: the gate's batch binds no memory budget)."""
    memory_policy_why: str = ABSENT
    """Why, with the saved activations per policy."""


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
    # activation checkpointing (tuning/recompute.py), tried only where memory ended the batch search
    checkpoint_tried: bool = ABSENT
    """Whether a checkpointing mode was run at a larger batch (details.activation_checkpoint)."""
    checkpoint_why: str = ABSENT
    """Why it was tried, or why not."""
    checkpoint_kept_not_exact: int = ABSENT
    """Modes kept whose step 1 at the holder's own batch was not bit-identical (bf16: within rounding)
    (count; must be 0)."""
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
    final_step1_loss: float = ABSENT
    """The final recipe's step-1 loss (nats per token)."""
    final_step1_grad_norm: float = ABSENT
    """The final recipe's step-1 grad norm."""
    untuned_step1_loss: float = ABSENT
    """The untuned recipe's step-1 loss (nats per token)."""
    untuned_step1_grad_norm: float = ABSENT
    """The untuned recipe's step-1 grad norm."""
    step1_loss: float | None = ABSENT
    """Step-1 loss of the final recipe's whole run (Trainer.train) (nats per token); None: it ran no step."""
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
