"""What every rung that trains shares: the gate's recipe, its numbers, one in-process run,
the steady-state statistics, the commands that reproduce it, and the eager evidence every
speed is put beside.

Not a rung (no RUNG): the engine only imports modules named after DESIGN section 1's rungs.
A titan_core `ConfigError` raised here reaches the engine, which turns it into bad input
(exit 2, nothing recorded) once for every rung.

The rungs, and what they import at load (this module among them), load no torch:
`onboard status` and `onboard list` import every rung with an accepted entry, to ask it
`reads_recipe_key` (onboard/engine/ladder.py). So what loads torch is imported inside the
function that uses it (`# lazy: ...; onboard status imports the rungs`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from onboard.engine.gates import PRECISIONS, ChecklistError, load_checklist, resolve_threshold
from onboard.rungs.contract import ABSENT, RungContext
from onboard.rungs.gated_runs import GatedRuns, record_run
from titan_core.config import load_config
from titan_core.config.loader import check_ranges, get_key, set_key
from titan_core.measure.run_stats import RunStats
from titan_core.measure.timing import compare_samples

DENSE_WHY = (
    "the recipe's MoE experts are the reference loop (kernels.moe = \"loop\"), which gathers each expert's tokens "
    "with torch.where: a host sync, a graph break under torch.compile and a data-dependent shape in a captured "
    'step; the capture-friendly experts (kernels.moe = "dense": dropless, static shapes, all experts on all '
    "tokens with a masked combine, n_experts / top_k x the expert FLOPs) compute the same sums"
)


@lru_cache(maxsize=None)
def checklist(rung: str):
    """checklists/<rung>.yaml, read once per process, as shipped (what the engine judges with)."""
    return load_checklist(rung)


def param(rung: str, name: str, precision: str | None = None) -> Any:
    """One of the `params:` of checklists/<rung>.yaml: every number a rung runs with to decide its gate;
    `timing` with this process's timing profile applied (`use_timing_profile`); a param given per
    precision ({fp32: ..., bf16: ...}) as the value of `precision` (the recipe's: `precision`)."""
    value = checklist(rung).param(name)
    if name == "timing":
        value = {**value, **TIMING_PROFILES[_timing_profile]}
    if isinstance(value, dict) and set(value) == set(PRECISIONS):
        if precision not in value:
            raise ChecklistError(f"checklists/{rung}.yaml: params.{name} is per precision; asked for {precision!r}")
        value = value[precision]
    return value


def bound(rung: str, criterion: str, precision: str, evidence: dict) -> float:
    """The bound of `criterion` (checklists/<rung>.yaml) for a run in `precision`, resolved against the
    passed rungs' `evidence`: for a rung that decides by its own gate's number before the gate runs
    (tuning keeps a change only within the bound its final recipe is judged by)."""
    c = checklist(rung).criterion(criterion)
    if c is None:
        raise ChecklistError(f"checklists/{rung}.yaml: no criterion '{criterion}'")
    spec, _, problem = c.bound(precision)
    value, problem = (None, problem) if problem else resolve_threshold(spec, {}, evidence)
    if problem:
        raise RuntimeError(f"{rung}: the bound of {criterion} in {precision} is unavailable: {problem}")
    return float(value)


# ---- the timing profile ----------------------------------------------------------------------
SHIPPED = "shipped"
TIMING_PROFILES: dict[str, dict[str, Any]] = {
    SHIPPED: {},
    # quick runs where background work is expected (tests, `onboard compat` beside other jobs), and its
    # decisions are recorded as quick and decide nothing a person relies on: the machine is not judged
    "quick": {
        "warmup": 1,
        "min_rounds": 2,
        "max_rounds": 3,
        "max_seconds": 2.0,
        "max_foreign_cores": float("inf"),
        "max_load_change": float("inf"),
        "retries_when_disturbed": 0,
    },
}
"""The timing protocols a process's rungs may time their keep/choose decisions with, by name: what
each sets over the checklists' `params.timing`. `shipped` (the default) is the checklists' own
protocol, the one a ladder is meant to run; `quick` stops each comparison after a few rounds, for
runs that ask whether each rung passes, not which flag is fastest on this machine (`onboard compat`,
tests of the ladder's mechanics). Only `params.timing` changes: criteria, thresholds and every
other param stay as shipped. Every attempt of a rung that times records the profile in its details
(`timing_record`), so a quick decision is never read as the shipped protocol's."""
_timing_profile = SHIPPED


def timing_profile() -> str:
    """The name of the timing profile this process's rungs time with (TIMING_PROFILES)."""
    return _timing_profile


def use_timing_profile(name: str) -> str:
    """Time every later decision of this process with TIMING_PROFILES[name]; returns the profile it replaces."""
    global _timing_profile
    if name not in TIMING_PROFILES:
        raise ValueError(f"unknown timing profile {name!r} (known: {', '.join(TIMING_PROFILES)})")
    before, _timing_profile = _timing_profile, name
    return before


@contextlib.contextmanager
def timing_profile_of(name: str):
    """`with timing_profile_of("quick"):` the rungs run inside time with it; the profile before, after."""
    before = use_timing_profile(name)
    try:
        yield
    finally:
        use_timing_profile(before)


def timing_record(rung_checklist) -> dict[str, Any]:
    """What an attempt's details say of the timing protocol its rung decided with: the profile's
    name and the protocol it ran (the checklist's `params.timing` with the profile over it); {} for
    a rung whose checklist times nothing. The engine adds it to every attempt it records."""
    shipped = rung_checklist.params.get("timing")
    if shipped is None:
        return {}
    return {"timing_profile": _timing_profile, "timing_protocol": {**shipped, **TIMING_PROFILES[_timing_profile]}}


# ---- the recipe a gate runs ----------------------------------------------------------------
MODE_KEYS = frozenset({"compile.enable", "graph_trainer.enable"})
"""The recipe keys that choose the execution mode. Every rung but kernels sets the mode it runs
itself (eager, or its own), so an edit of these keys leaves their evidence standing."""


TUNING_KEYS = frozenset({"kernels.ce_chunk", "training.batch_size", "training.grad_accum", "device.threads",
                         "graph_trainer.compile", "tpu.libtpu_init_flags"})  # fmt: skip
"""The recipe keys the tuning rung may edit. Its gate proves its own edits: the final recipe against
the untuned one the earlier rungs verified, on the same rows, and the final recipe run whole; so
tuning's edit of these keys leaves the earlier rungs' evidence standing (a hand edit of them, like
any hand edit, still re-verifies every rung that reads them)."""


def reads_all_but_mode(key: str) -> bool:
    """`reads_recipe_key` of a rung that runs its own execution mode: every key but MODE_KEYS
    (and TUNING_KEYS, which the tuning rung proves)."""
    return key not in MODE_KEYS and key not in TUNING_KEYS


def reads_all_but_tuning(key: str) -> bool:
    """`reads_recipe_key` of a rung that runs the recipe's own mode: every key but TUNING_KEYS."""
    return key not in TUNING_KEYS


def recipe(ctx: RungContext):
    """The workspace recipe exactly as written (paths anchored by titan_core's loader)."""
    return load_config(ctx.workspace.recipe_path)


def job_config(ctx: RungContext):
    """The workspace recipe, adjusted for the gate: eager execution (a rung that runs another mode
    switches it on itself), the eager gate's steps on its repeated batch (warm-up capped so the
    peak lr is reached), output in the attempt folder, nothing saved or profiled (the gate
    measures training, not checkpointing). Works from any folder. A run of it names the GATE_KEYS
    values that differ from the recipe's (`announce`)."""
    steps = param("eager", "steps")
    cfg = recipe(ctx)
    cfg.compile.enable = False
    cfg.graph_trainer.enable = False
    cfg.training.steps = steps
    cfg.lr_scheduler.warmup_steps = min(cfg.lr_scheduler.warmup_steps, int(steps * param("eager", "warmup_cap")))
    cfg.data.repeat_batch = True
    cfg.checkpoint.enable = False
    cfg.checkpoint.export_hf = ""
    cfg.profiler.enable = False
    cfg.metrics.output_dir = str(ctx.attempt_dir)
    cfg.metrics.log_freq = 5
    cfg.metrics.rich = False
    return cfg


GATE_KEYS = ("training.steps", "lr_scheduler.warmup_steps", "data.repeat_batch")
"""The recipe keys a gate sets to its own values for the run it judges (`job_config`, a rung's
steps); a run whose value differs from the recipe's says so (`gate_overrides`). The execution
mode is not among them: each rung runs the mode it verifies and names it in its log."""


def gate_overrides(ctx: RungContext, cfg) -> list[str]:
    """One line per GATE_KEYS value of `cfg` (a run of the gate) that differs from the recipe's,
    e.g. "the gate runs 20 steps (recipe says 7)"."""
    written = recipe(ctx)
    out = []
    for dotted in GATE_KEYS:
        gate, mine = get_key(cfg, dotted), get_key(written, dotted)
        if gate == mine:
            continue
        if dotted == "training.steps":
            out.append(f"the gate runs {gate} steps (recipe says {mine})")
        else:
            out.append(f"the gate runs {dotted} = {_toml(gate)} (recipe says {_toml(mine)})")
    return out


def _toml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def announce(ctx: RungContext, cfg, label: str) -> list[str]:
    """Log what one run of the gate trains, and each value it overrides; returns those overrides
    (a rung records them in its details as "gate_overrides")."""
    ctx.log(f"{label}: {cfg.training.steps} steps -> {cfg.metrics.output_dir}")
    notes = gate_overrides(ctx, cfg)
    for note in notes:
        ctx.log(f"{label}: {note}")
    return notes


def files_read(ctx: RungContext, cfg) -> list[Path]:
    """The files whose change makes a training rung's evidence stale: the recipe and what
    defines the workspace's model (config.json, the adapter, model.py; the workspace's own
    adapter.py and model.py even where the recipe names other ones, as parity reads them),
    the weights (`Workspace.hashes` fingerprints safetensors cheaply) and a text data file."""
    ws = ctx.workspace
    files = [ws.recipe_path]
    for value in (cfg.model.hf_config, cfg.model.adapter_file, cfg.model.module_file):
        if value:
            files.append(Path(value))
    files += [p for p in (ws.hf_config_path, ws.adapter_path, ws.model_file) if p is not None and p.is_file()]
    files += ws.weight_files()
    if cfg.data.source == "text" and cfg.data.path and Path(cfg.data.path).is_file():
        files.append(Path(cfg.data.path))
    return list(dict.fromkeys(p.resolve() for p in files))


def next_step_command(ctx: RungContext) -> str:
    """The command that reproduces a rung's attempt from any folder (the workspace is <dir>/onboarding/<name>)."""
    return f"onboard next-step {ctx.workspace.name} --dir {ctx.workspace.root.parent.parent}"


def train_command(ctx: RungContext, flags: list[str]) -> str:
    """`onboard train` of the workspace recipe with the flags a rung verified."""
    return " ".join(["onboard", "train", "--config", str(ctx.workspace.recipe_path), *flags])


def resolved_device_type(device_type: str) -> str:
    """`[device] type` as titan_core resolves it (`auto`: cuda when available, else cpu)."""
    import torch  # lazy: torch; onboard status imports the rungs

    if device_type == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device_type


def model_args(cfg):
    """The recipe's resolved architecture (a recipe that does not resolve raises ConfigError)."""
    # lazy: loads torch; onboard status imports the rungs
    from titan_core.training.model_builder import resolve_model_args

    return resolve_model_args(cfg.model)


def precision(training) -> str:
    """"fp32" or "bf16": the precision the recipe's runs compute in, which picks the bound of every
    criterion that compares two of its runs (onboard.engine.gates, per-precision thresholds). bf16 as
    soon as any of the recipe's dtypes is bf16 (compute, gathered params, or the gradient reduce)."""
    dtypes = (training.dtype, training.mixed_precision_param, training.mixed_precision_reduce)
    return "bf16" if "bfloat16" in dtypes else "fp32"


def compute_dtype(training):
    """The dtype the recipe computes in: it decides which kernels can run (e.g. grouped_mm)."""
    import torch  # lazy: torch; onboard status imports the rungs

    bf16 = "bfloat16" in (training.dtype, training.mixed_precision_param)
    return torch.bfloat16 if bf16 else torch.float32


# ---- execution modes (compile, graph_trainer) ------------------------------------------------
def capture_moe(cfg, args) -> tuple[str | None, str]:
    """(kernels.moe choice to run a captured step with, or None to keep the recipe's; why).

    The reference loop is replaced, and so is a kernel that titan_core says cannot be
    traced here (torch._grouped_mm's meta function takes bf16 only); a capture problem
    with a kernel that claims it can is the finding the gate should report.
    """
    from onboard.rungs.kernel_compare import applicable_kernels  # lazy: loads torch; onboard status imports the rungs

    if not args.n_experts:
        return None, "dense model: no MoE experts"
    moe = cfg.kernels.moe
    if moe == "loop":
        from titan_core.config.swaps import swap_applicability  # lazy: loads torch; onboard status imports the rungs
        from titan_core.training.model_builder import build_meta_model  # lazy: as above

        own = swap_applicability(build_meta_model(cfg.model, args), ["moe.dense"])["moe.dense"]
        if own and not own.startswith("no module"):  # experts of the model's own class: no kernel swaps them
            return None, f"the model's own experts are captured as they are: {own}"
        return "dense", DENSE_WHY
    if moe != "dense":
        device = resolved_device_type(cfg.device.type)
        why = applicable_kernels(args, device=device, dtype=compute_dtype(cfg.training), captured=True).get(
            f"kernels.moe={moe}"
        )
        if why:
            return "dense", f'the recipe\'s kernels.moe = "{moe}" cannot be captured here ({why}); dense instead'
    return None, f'the recipe\'s kernels.moe = "{moe}" is kept'


def mode_config(base, out_dir: Path, *, steps: int, deterministic: bool = False, moe: str | None = None, **sections):
    """The gate's recipe for another execution mode: `sections` maps 'compile' /
    'graph_trainer' to the fields to set there; the other mode is switched off."""
    cfg = copy.deepcopy(base)
    cfg.compile.enable = False
    cfg.graph_trainer.enable = False
    for section, fields in sections.items():
        for name, value in fields.items():
            set_key(cfg, f"{section}.{name}", value)
    if moe is not None:
        cfg.kernels.moe = moe
    cfg.training.steps = steps
    cfg.training.deterministic = deterministic
    cfg.metrics.output_dir = str(out_dir)
    return cfg


@contextlib.contextmanager
def process_threads(n: int = 0):
    """Run with `n` intra-op threads (0: leave them), then give the process its own count back.

    torch's thread count is process-wide and a Trainer sets it from [device] threads, so
    without this one in-process run would hand its count to the next.
    """
    import torch  # lazy: torch; onboard status imports the rungs

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def quiet_mesh_pickling():
    """Silence torch's DeviceMesh pickling warning for the duration of a compile.

    Dynamo's cache keys pickle the SimpleFSDP mesh; torch then warns, once per block and
    step, that a mesh pickled before its process groups existed cannot find them. Here
    the groups exist before anything is compiled (titan_core creates them, also at world
    size 1), so the warning is noise that would bury the rung's progress lines.
    """
    logger = logging.getLogger("torch.distributed.device_mesh")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def build_trainer(cfg):
    """A titan_core Trainer of `cfg`, quiet (the rung prints its own progress), its values range-checked
    as a loaded recipe's are (a ConfigError: bad input)."""
    from titan_core.training.trainer import Trainer  # lazy: loads torch; onboard status imports the rungs

    return Trainer(check_ranges(cfg), quiet=True)


def train(ctx: RungContext, cfg, label: str):
    """(trainer, result) of one in-process run of `cfg` (announced, overrides included), recorded as
    a gated run (`record_run`): one that stopped early or logged a non-finite value says so."""
    announce(ctx, cfg, label)
    with process_threads():
        trainer = build_trainer(cfg)
        with quiet_mesh_pickling():
            result = trainer.train()
    if not result.metrics:
        raise RuntimeError(f"{label}: training ran no step")
    if result.stopped:
        ctx.log(f"{label}: {result.stopped}")
    record_run(ctx, label, result.metrics, cfg.training.steps)
    return trainer, result


def train_recipe(ctx: RungContext, edits, *, steps: int, label: str):
    """(trainer, result) of the recipe as `edits` (a rung's RecipeEdits) would leave it, in the recipe's
    own execution mode, for `steps` on the gate's batch, recorded as a gated run: what the user takes
    away, run as a whole before the gate lets the edits in."""
    cfg = job_config(ctx)
    written = recipe(ctx)
    cfg.compile.enable, cfg.graph_trainer.enable = written.compile.enable, written.graph_trainer.enable
    for e in edits:
        set_key(cfg, e.key, e.value)
    cfg.training.steps = steps
    cfg.metrics.output_dir = str(ctx.attempt_dir / "recipe")
    return train(ctx, cfg, label)


# ---- measurements ----------------------------------------------------------------------------
@dataclass(kw_only=True)
class SteadyRun(GatedRuns):
    """The speed and memory of one run's steady window (`run_stats`: titan_core.measure.run_stats.RunStats)."""

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
    """Eager's median step time over this run's (x; > 1: this run is faster)."""
    vs_eager: dict | None = ABSENT
    """The timing protocol's unpaired comparison of the two step-time samples (ratio, interval,
    outcome: titan_core.measure.timing.Comparison.to_dict); None: eager recorded no step times."""
    vs_eager_text: str = ABSENT
    """`vs_eager` in one line, or why there is no interval."""
    speedup_vs_eager_ci: str | None = ABSENT
    """The speedup with its interval, short (e.g. "1.29x (1.21-1.38)", "~1 (0.93-1.08)")."""
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


def run_stats(rows: list[dict]) -> dict[str, Any]:
    """The steady-state speed and memory measurements of one run's rows (titan_core.measure.run_stats)."""
    return RunStats.from_rows(rows).measurements()


def beside_eager(m: BesideEager, evidence: dict) -> None:
    """Put this run's step times and peak memory beside the eager rung's: ratios, and the
    timing protocol's interval on the step-time ratio (two runs timed apart: unpaired)."""
    ev = evidence.get("eager") or {}
    m.eager_step_time_median_s = ev.get("step_time_median_s")
    m.eager_peak_mem_bytes = ev.get("peak_mem_bytes")
    if ev.get("step_time_median_s"):
        m.speedup_vs_eager = ev["step_time_median_s"] / m.step_time_median_s
    cmp = compare_samples(m.get("step_times_s") or [], ev.get("step_times_s") or [])
    m.vs_eager = cmp.to_dict() if cmp else None
    m.vs_eager_text = cmp.describe("this run", "eager") if cmp else "no interval (eager evidence has no step times)"
    m.speedup_vs_eager_ci = cmp.short() if cmp else None
    if ev.get("peak_mem_bytes"):
        m.peak_mem_vs_eager = m.peak_mem_bytes / ev["peak_mem_bytes"]


def eager_step1_loss(ctx: RungContext) -> float:
    """The eager rung's exact step-1 loss (the ladder runs this rung only after eager passed)."""
    ev = ctx.evidence.get("eager")
    if not ev or "step1_loss_repr" not in ev:
        raise RuntimeError("no passed eager evidence to compare with: run the eager rung first")
    return float(ev["step1_loss_repr"])
