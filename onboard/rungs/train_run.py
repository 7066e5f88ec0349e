"""Run a training process: one in-process titan_core Trainer of a gate's recipe, quiet, with the
process's thread count given back after it, recorded as a gated run (onboard/ladder/contract.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from onboard.ladder.contract import METRICS_FILE, RungContext, record_run
from onboard.rungs.gate_recipe import announce, job_config, recipe
from titan_core.config.loader import check_ranges, set_key
from titan_core.config.execution_modes import execution_mode, set_execution_mode
from titan_core.runtime.quiet import quiet_loggers
from titan_core.training.trainer import Trainer
import torch


@contextlib.contextmanager
def process_threads(n: int = 0):
    """Run with `n` intra-op threads (0: leave them), then give the process its own count back.

    torch's thread count is process-wide and a Trainer sets it from [device] threads, so
    without this one in-process run would hand its count to the next.
    """
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def quiet_mesh_pickling():
    """Silence torch's DeviceMesh pickling warning for the duration of a compile: dynamo's cache keys
    pickle the SimpleFSDP mesh, and torch warns, once per block and step, that a mesh pickled before
    its process groups existed cannot find them; here the groups exist first (titan_core creates
    them, also at world size 1), so the warning is noise that would bury the rung's progress lines."""
    return quiet_loggers("torch.distributed.device_mesh")


def build_trainer(cfg):
    """A titan_core Trainer of `cfg`, quiet (the rung prints its own progress), its values range-checked
    as a loaded recipe's are (a ConfigError: bad input)."""
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
    # the file it wrote, named: the ledger's readers re-read it against the rows recorded here
    record_run(ctx, label, result.metrics, cfg.training.steps, Path(cfg.metrics.output_dir) / METRICS_FILE)
    return trainer, result


def train_recipe(ctx: RungContext, edits, *, steps: int, label: str):
    """(trainer, result) of the recipe as `edits` (a rung's RecipeEdits) would leave it, in the recipe's
    own execution mode, for `steps` on the gate's batch, recorded as a gated run: what the user takes
    away, run as a whole before the gate lets the edits in."""
    cfg = job_config(ctx)
    set_execution_mode(cfg, execution_mode(recipe(ctx)))
    for e in edits:
        set_key(cfg, e.key, e.value)
    cfg.training.steps = steps
    cfg.metrics.output_dir = str(ctx.attempt_dir / "recipe")
    return train(ctx, cfg, label)
