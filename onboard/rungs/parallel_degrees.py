"""The simple_fsdp rung's proof of the parallel degrees a recipe asks for beyond data parallelism:
expert (`parallelism.ep`), context (`cp`) and pipeline (`pp`) parallelism, each exact against one
process that trains the same rows.

For each of the recipe's degrees above 1 the workspace's model (the twin where the workspace has
one: the gate's recipe builds it) trains `params.degree_steps` fp32 steps on 2 processes with that
degree set to 2 and the other two at 1, and one process trains the same rows (`baseline_config`);
the gate holds the largest relative distance of the two runs' losses and grad norms over every
step (`measure`). The rows are fresh each step (data.repeat_batch off) and the same in both runs
(titan_core's loader numbers rows globally: micro-batch k of dp rank r holds rows (k*dp + r)*b ...):

- ep = 2: the experts are split over the 2 data-parallel ranks (ep is carved from dp_shard), each
  rank b = B/2 rows per micro-batch; the one process takes them as 2 x grad_accum micro-batches of
  b. Micro-batches, not one batch of B: a MoE load-balancing loss is a mean per forward pass
  (simple_fsdp_rung.baseline_reason), and the dispatch keeps each rank's rows its own forward pass.
- cp = 2: both ranks read the same B rows and each keeps half of every row's tokens; the one
  process the same B rows in the recipe's grad_accum micro-batches.
- pp = 2, the recipe's pp_schedule: two stages, both ranks the same B rows in grad_accum
  micro-batches (the schedule's micro-batches); the one process the same micro-batches.
- combinations: cp and ep together run cp = ep = 2 on the same 2 ranks (ep carved from cp); pp with
  cp or ep on 4 (2 stages, each over 2 ranks). A combination is checked with titan_core's own
  refusal first: one it refuses (a feature of the recipe it does not run with them) is never launched.

What a proof changes from the recipe, each said in the log and in the degree's `notes`: a
seq_len that 2 x cp does not divide is cut to the largest multiple below it; rows dropped at the
dispatch (ep_capacity_factor > 0) are not: dropless, since a dropped row changes the result by
design; under cp the MoE load-balancing loss is off, its statistics over half of each row per
rank differing from cp = 1's by design (tests/core/parallel/_cp_cases.py does the same); a
recipe's pp_layers is kept only where its pp is 2 (it splits the recipe's stages, not 2).

A degree titan_core refuses (a ConfigError before the launch, or a rank that exits 2 with one)
is not proved, with titan_core's message: the attempt fails naming it, never passes it unrun.
Per-parameter step-1 gradients are not compared here: a rank of `titan_core.train` writes none
(titan_core's own tests compare them: tests/core/dist/test_expert_parallel.py,
tests/core/parallel/test_context_parallel.py, test_pipeline_parallel.py); the grad norm of every
step stands for them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

import titan_core.train
from onboard.ladder.contract import RungContext
from onboard.ladder.contract import record_run
from onboard.ladder.measurements.training_measurements import SimpleFsdpMeasurements
from onboard.rungs import gate_recipe, train_run
from titan_core.config.loader import ConfigError
from titan_core.measure.numerics import curve_max_rel
from titan_core.parallel import check_parallelism
from titan_core import launcher

RUNG = "simple_fsdp"
CRITERION = "parallel_degrees_exact"
"""The checklist criterion whose fp32 bound a degree's distance must stay within to count as proved."""
DEGREES = ("ep", "cp", "pp")
"""The degrees proved here, in the order they are run."""
FP32 = "float32"


@dataclass
class DegreeProof:
    """One degree (or combination) of the recipe, run at 2 against one process."""

    label: str
    """"ep", "cp", "pp" or a combination ("cp+ep")."""
    degrees: dict[str, int]
    """The degrees of the run, e.g. {"ep": 2}."""
    recipe: dict[str, int]
    """What the recipe asks of them, e.g. {"ep": 8}."""
    world_size: int
    notes: list[str] = field(default_factory=list)
    """What the proof changed from the recipe, and why (module docstring)."""
    refused: str | None = None
    """titan_core's message when it refused the run (nothing proved)."""
    failure: str | None = None
    """Why the run or its baseline stopped, when it did."""
    loss_max_rel_err: float = math.inf
    grad_norm_max_rel_err: float = math.inf
    worst_step: int | None = None
    steps_run: int = 0
    run_dir: str | None = None
    baseline: str | None = None

    @property
    def max_rel_err(self) -> float:
        return max(self.loss_max_rel_err, self.grad_norm_max_rel_err)

    def why_unproved(self, bound: float) -> str | None:
        """One line saying why this degree is not proved within `bound`; None: it is."""
        if self.refused:
            return f"{self.label}: titan_core refuses it: {self.refused}"
        if self.failure:
            return f"{self.label}: {self.failure.splitlines()[0]}"
        if not self.max_rel_err <= bound:  # nan too
            return (
                f"{self.label}: losses / grad norms {self.loss_max_rel_err:.2e} / {self.grad_norm_max_rel_err:.2e} "
                f"from one process (worst step {self.worst_step}), bound {bound:g}"
            )
        return None

    def to_dict(self, bound: float) -> dict:
        return {
            "degrees": self.degrees, "recipe": self.recipe, "world_size": self.world_size, "notes": self.notes,
            "refused": self.refused, "failure": self.failure, "loss_max_rel_err": self.loss_max_rel_err,
            "grad_norm_max_rel_err": self.grad_norm_max_rel_err, "max_rel_err": self.max_rel_err,
            "worst_step": self.worst_step, "steps_run": self.steps_run, "run_dir": self.run_dir,
            "baseline": self.baseline, "proved": self.why_unproved(bound) is None,
        }  # fmt: skip


def needed(recipe) -> list[str]:
    """The recipe's degrees above 1 (DEGREES order), and their combination when it asks more than one."""
    p = recipe.parallelism
    names = [d for d in DEGREES if getattr(p, d) > 1]
    return names + (["+".join(sorted(names))] if len(names) > 1 else [])


def share_cores(cfg, world: int) -> None:
    """W processes with torch's default threads each would fight over the cores (4x slower here): give
    each rank of a CPU run its share."""
    if gate_recipe.resolved_device_type(cfg.device.type) == "cpu":
        fair = max(1, launcher.cpu_count() // world)
        if not cfg.device.threads or cfg.device.threads > fair:
            cfg.device.threads = fair


def _fp32(cfg, steps: int, out_dir: Path) -> None:
    t = cfg.training
    t.steps, t.dtype, t.mixed_precision_param, t.mixed_precision_reduce = steps, FP32, FP32, FP32
    cfg.data.repeat_batch = False  # fresh rows each step, the same in both runs (module docstring)
    cfg.metrics.output_dir = str(out_dir)


def degree_config(base, recipe, label: str, out_dir: Path, steps: int) -> tuple[object, int, list[str]]:
    """(config, world size, notes) of the run proving `label` at 2 on the gate's recipe `base`."""
    cfg = copy.deepcopy(base)
    names = label.split("+")
    p, rp = cfg.parallelism, recipe.parallelism
    p.dp_replicate, p.dp_shard, p.tp, p.sequence_parallel = 1, -1, 1, False
    p.data_parallel = rp.data_parallel
    notes = []
    for name in names:
        setattr(p, name, 2)
    world = (2 if "pp" in names else 1) * (2 if "cp" in names else 1)
    if "ep" in names and "cp" not in names:
        world *= 2  # ep is carved from dp_shard x cp: without cp, 2 data-parallel ranks
    if "pp" in names:
        p.pp_schedule = rp.pp_schedule
        p.pp_layers = list(rp.pp_layers) if rp.pp == 2 else []
        if rp.pp_layers and rp.pp != 2:
            notes.append(f"parallelism.pp_layers = {rp.pp_layers} splits the recipe's pp = {rp.pp} stages: "
                         "2 stages split evenly")  # fmt: skip
    if "ep" in names and rp.ep_capacity_factor > 0:
        notes.append(f"parallelism.ep_capacity_factor = {rp.ep_capacity_factor:g} off: dropped rows change the result "
                     "by design, so the dispatch is proved dropless")  # fmt: skip
    if "cp" in names:
        seq = cfg.training.seq_len
        if seq % 4:
            cfg.training.seq_len = max(4, seq - seq % 4)
            notes.append(f"training.seq_len {seq} -> {cfg.training.seq_len}: cp = 2 cuts each row into 4 equal chunks")
        if gate_recipe.model_args(cfg).aux_loss_coef:
            cfg.model.overrides = {**cfg.model.overrides, "aux_loss_coef": 0.0}
            notes.append("the MoE load-balancing loss off: under cp its statistics cover half of each row per rank, "
                         "which differs from cp = 1 by design")  # fmt: skip
    dp = world // ((2 if "pp" in names else 1) * (2 if "cp" in names else 1))
    cfg.training.batch_size = base.training.batch_size // dp
    _fp32(cfg, steps, out_dir)
    share_cores(cfg, world)
    return cfg, world, notes


def baseline_config(run_cfg, base, world: int, out_dir: Path):
    """One process over the rows of `run_cfg` (a degree's run on `world` ranks): its dp ranks' rows as
    micro-batches (module docstring), the same model, sequence and steps."""
    p = run_cfg.parallelism
    dp = world // (p.pp * p.cp)
    cfg = copy.deepcopy(base)
    cfg.model.overrides = dict(run_cfg.model.overrides)
    cfg.training.seq_len = run_cfg.training.seq_len
    cfg.training.batch_size = run_cfg.training.batch_size
    cfg.training.grad_accum = run_cfg.training.grad_accum * dp
    _fp32(cfg, run_cfg.training.steps, out_dir)
    return cfg


def _baseline_key(cfg) -> tuple:
    t = cfg.training
    return t.batch_size, t.grad_accum, t.seq_len, tuple(sorted(cfg.model.overrides.items()))


def prove(ctx: RungContext, base, recipe, steps: int, timeout_s: float) -> list[DegreeProof]:
    """Each degree of `needed(recipe)` run at 2 (a refused combination: titan_core's check only) against
    one process on the same rows; logged, each launched run recorded as a gated run."""
    proofs, baselines = [], {}
    for label in needed(recipe):
        out = ctx.attempt_dir / "degrees" / label.replace("+", "_")
        cfg, world, notes = degree_config(base, recipe, label, out, steps)
        proof = DegreeProof(label, {n: 2 for n in label.split("+")}, {n: getattr(recipe.parallelism, n)
                            for n in label.split("+")}, world, notes, run_dir=ctx.workspace.key_for(out))  # fmt: skip
        proofs.append(proof)
        for note in notes:
            ctx.log(f"simple_fsdp: {label} = 2: {note}")
        try:
            check_parallelism(cfg, world)
        except ConfigError as e:
            proof.refused = str(e)
            ctx.log(f"simple_fsdp: {label} = 2 refused by titan_core: {e}")
            continue
        ctx.log(f"simple_fsdp: {label} = 2 on {world} processes, {steps} fp32 steps -> {cfg.metrics.output_dir}")
        rows = _launch(ctx, proof, cfg, world, timeout_s)
        if rows is None:
            continue
        base_cfg = baseline_config(cfg, base, world, ctx.attempt_dir / "degrees" / f"baseline-{len(baselines)}")
        key = _baseline_key(base_cfg)
        if key not in baselines:
            baselines[key] = _baseline(ctx, base_cfg, label)
        want, why = baselines[key]
        t = base_cfg.training
        proof.baseline = f"1 process, {t.grad_accum} micro-batches of {t.batch_size} rows x {t.seq_len} tokens"
        if why:
            proof.failure = f"the one-process baseline failed: {why}"
            continue
        proof.loss_max_rel_err, step = curve_max_rel(*([r["loss"] for r in x] for x in (rows, want)))
        proof.grad_norm_max_rel_err, gstep = curve_max_rel(*([r["grad_norm"] for r in x] for x in (rows, want)))
        proof.worst_step = step if proof.loss_max_rel_err >= proof.grad_norm_max_rel_err else gstep
        ctx.log(f"simple_fsdp: {label} = 2 vs {proof.baseline}: losses max rel {proof.loss_max_rel_err:.2e}, "
                f"grad norms {proof.grad_norm_max_rel_err:.2e}")  # fmt: skip
    return proofs


def _launch(ctx: RungContext, proof: DegreeProof, cfg, world: int, timeout_s: float) -> list[dict] | None:
    """Rank 0's rows of the degree's run; None when it did not run whole (`proof` then says why)."""
    try:
        run = launcher.run_world(cfg, world, timeout_s=timeout_s)
    except ConfigError as e:  # the launcher's own checks (a device count, a range)
        proof.refused = str(e)
        ctx.log(f"simple_fsdp: {proof.label} = 2 refused by titan_core: {e}")
        return None
    rows = run.metrics
    proof.steps_run = len(rows)
    if run.launch.exit_code == 2:  # a rank's ConfigError (train.main prints "error: ..." and exits 2): no run
        proof.refused = run.launch.refusal()
        ctx.log(f"simple_fsdp: {proof.label} = 2 refused by titan_core: {proof.refused}")
        return None
    record_run(ctx, f"simple_fsdp: {proof.label} = 2", rows, cfg.training.steps)
    if run.ok and len(rows) == cfg.training.steps:
        return rows
    said = run.launch.failure or f"{len(rows)} of {cfg.training.steps} steps logged"
    proof.failure = f"the {world}-process run failed: {said}"
    ctx.log(f"simple_fsdp: {proof.label} = 2: {proof.failure}")
    return None


def _baseline(ctx: RungContext, cfg, label: str) -> tuple[list[dict], str | None]:
    """(rows, failure or None) of one in-process baseline run, recorded as a gated run."""
    ctx.log(f"simple_fsdp: {label} baseline: 1 process, {cfg.training.steps} fp32 steps -> {cfg.metrics.output_dir}")
    try:
        with train_run.process_threads():
            result = titan_core.train.run(cfg, quiet=True)
    except ConfigError as e:
        return [], f"refused by titan_core: {e}"
    record_run(ctx, f"simple_fsdp: {label} baseline", result.metrics, cfg.training.steps)
    if len(result.metrics) != cfg.training.steps:
        return result.metrics, result.stopped or f"{len(result.metrics)} of {cfg.training.steps} steps logged"
    return result.metrics, None


def measure(proofs: list[DegreeProof], bound: float) -> SimpleFsdpMeasurements:
    """The simple_fsdp record's parallel_degrees* part, of the proofs (`bound`: the checklist's fp32 bound
    of CRITERION)."""
    unproved = [w for w in (p.why_unproved(bound) for p in proofs) if w]
    return SimpleFsdpMeasurements(
        parallel_degrees_needed=[p.label for p in proofs],
        parallel_degrees={p.label: p.to_dict(bound) for p in proofs},
        # nothing needed: nothing to be off by; a degree refused or stopped is infinitely off
        parallel_degrees_max_rel_err=max((p.max_rel_err for p in proofs), default=0.0),
        parallel_degrees_unproved=len(unproved),
        parallel_degrees_unproved_why=unproved,
    )


def run(ctx: RungContext, base) -> SimpleFsdpMeasurements:
    """The simple_fsdp record's degree part for the workspace recipe (`base`: the gate's recipe)."""
    recipe = gate_recipe.recipe(ctx)
    if not needed(recipe):
        ctx.log("simple_fsdp: the recipe asks no expert, context or pipeline degree (parallelism.ep = cp = pp = 1): "
                "parallel_degrees_needed = [], nothing to prove")  # fmt: skip
        return measure([], 0.0)
    bound = gate_recipe.bound(RUNG, CRITERION, "fp32", ctx.evidence)
    steps, timeout_s = gate_recipe.param(RUNG, "degree_steps"), float(gate_recipe.param(RUNG, "timeout_s"))
    proofs = prove(ctx, base, recipe, steps, timeout_s)
    m = measure(proofs, bound)
    unproved = [line.partition(":")[0] for line in m.parallel_degrees_unproved_why]
    # each reason was said as its degree ran, and the gate's table says it again: named here, not repeated
    ctx.log(f"simple_fsdp: parallel degrees {', '.join(m.parallel_degrees_needed)}: "
            f"{len(proofs) - m.parallel_degrees_unproved} of {len(proofs)} proved within {bound:g}"
            + (f"; not proved: {', '.join(unproved)} (why above)" if unproved else ""))  # fmt: skip
    return m
