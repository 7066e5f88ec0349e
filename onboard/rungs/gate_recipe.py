"""The recipe a rung's gate runs, and the numbers it runs with: checklists/<rung>.yaml's params
and bounds, the workspace recipe adjusted for the gate (eager, the gate's steps on its repeated
batch, output in the attempt folder), what it overrides, the files whose change makes it stale,
the commands that reproduce it, and what the recipe resolves to (device, precision, architecture).

A titan_core `ConfigError` raised here reaches the engine, which turns it into bad input (exit 2,
nothing recorded) once for every rung.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from onboard.ladder.contract import RecipeEdit, RungContext, RungResult
from onboard.ladder.gates import PRECISIONS, ChecklistError, load_checklist, resolve_threshold
from titan_core.config import load_config
from titan_core.config.loader import get_key
from titan_core.config.execution_modes import set_execution_mode
from titan_core.runtime.devices import device_type as resolved_device_type  # noqa: F401  (the rungs' name for it)
from titan_core.config.dtypes import compute_dtype  # noqa: F401  (the rungs read it here, with the recipe's other rules)
import torch
from titan_core.models.model_builder import resolve_model_args


@lru_cache(maxsize=None)
def checklist(rung: str):
    """checklists/<rung>.yaml, read once per process, as shipped (what the engine judges with)."""
    return load_checklist(rung)


def param(rung: str, name: str, precision: str | None = None) -> Any:
    """One of the `params:` of checklists/<rung>.yaml: every number a rung runs with to decide its gate;
    `timing` as shipped (a rung times with `timing_profiles.protocol`, its attempt's profile over
    it); a param given per precision ({fp32: ..., bf16: ...}) as the value of `precision` (the
    recipe's: `precision`)."""
    value = checklist(rung).param(name)
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


def recipe(ctx: RungContext):
    """The workspace recipe exactly as written (paths anchored by titan_core's loader)."""
    return load_config(ctx.workspace.recipe_path)


def job_config(ctx: RungContext):
    """The workspace recipe, adjusted for the gate: eager execution (a rung that runs another mode
    switches it on itself), the eager gate's steps on its repeated batch (warm-up capped so the
    peak lr is reached), output in the attempt folder, nothing saved or profiled (the gate
    measures training, not checkpointing), one process's degrees (ep = cp = pp = 1: the simple_fsdp rung
    proves the recipe's). Works from any folder. A run of it names the GATE_KEYS values that differ from
    the recipe's (`announce`)."""
    steps = param("eager", "steps")
    cfg = recipe(ctx)
    set_execution_mode(cfg, "eager")
    cfg.training.steps = steps
    cfg.lr_scheduler.warmup_steps = min(cfg.lr_scheduler.warmup_steps, int(steps * param("eager", "warmup_cap")))
    cfg.data.repeat_batch = True
    cfg.checkpoint.enable = False
    cfg.checkpoint.export_hf = ""
    cfg.profiler.enable = False
    cfg.metrics.output_dir = str(ctx.attempt_dir)
    cfg.metrics.log_freq = 5
    cfg.metrics.rich = False
    # a gate's runs are one process (or W data-parallel ones): the expert, context and pipeline degrees
    # the recipe asks for are proved by the simple_fsdp rung (onboard/rungs/parallel_degrees.py)
    p = cfg.parallelism
    p.ep, p.cp, p.pp, p.pp_layers, p.ep_capacity_factor = 1, 1, 1, [], 0.0
    return cfg


GATE_KEYS = ("training.steps", "lr_scheduler.warmup_steps", "data.repeat_batch", "parallelism.ep", "parallelism.cp",
             "parallelism.pp", "parallelism.pp_layers", "parallelism.ep_capacity_factor")  # fmt: skip
"""The recipe keys a gate sets to its own values for the run it judges (`job_config`, a rung's
steps, the degrees of one process); a run whose value differs from the recipe's says so
(`gate_overrides`). The execution mode is not among them: each rung runs the mode it verifies
and names it in its log."""


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


def result(ctx: RungContext, cfg, m, details: dict, edits: list[RecipeEdit] | None = None) -> RungResult:
    """A training rung's RungResult: `m` and `details` with the files read and the command of a gate run of `cfg`."""
    return RungResult(measurements=m, files_read=files_read(ctx, cfg), command=next_step_command(ctx),
                      details=details, recipe_edits=edits or [])  # fmt: skip


def train_command(ctx: RungContext, flags: list[str]) -> str:
    """`onboard train` of the workspace recipe with the flags a rung verified."""
    return " ".join(["onboard", "train", "--config", str(ctx.workspace.recipe_path), *flags])


def model_args(cfg):
    """The recipe's resolved architecture (a recipe that does not resolve raises ConfigError)."""
    return resolve_model_args(cfg.model)


def world_size(device_type: str) -> int:
    """W, the processes of the simple_fsdp rung's sharded runs: params.cpu_world (2) on CPU; every local
    device on an accelerator. Shared: the fit (onboard/sizing/fit.py) sizes those runs by it."""
    device_type = resolved_device_type(device_type)
    if device_type == "cpu":
        return param("simple_fsdp", "cpu_world")
    backend = getattr(torch, device_type, None)
    count = backend.device_count() if backend is not None and hasattr(backend, "device_count") else 1
    return max(1, int(count))


def precision(training) -> str:
    """"fp32" or "bf16": the precision the recipe's runs compute in, which picks the bound of every
    criterion that compares two of its runs (onboard.ladder.gates, per-precision thresholds). bf16 as
    soon as any of the recipe's dtypes is bf16 (compute, gathered params, or the gradient reduce)."""
    dtypes = (training.dtype, training.mixed_precision_param, training.mixed_precision_reduce)
    return "bf16" if "bfloat16" in dtypes else "fp32"


