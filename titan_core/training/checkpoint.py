"""Checkpoints in torch.distributed.checkpoint (DCP) format.

One code path for every world size: model and optimizer state go through
`get_/set_model_state_dict` and `get_/set_optimizer_state_dict`, so DTensor-sharded
parameters (SimpleFSDP, FSDP2) are saved as shards and plain tensors as themselves.
Without a process group DCP runs in single-process mode; it would warn on every call
that it assumes so, which is exactly our intent, so that one warning is silenced.

A checkpoint is `folder/step-N`, written to `folder/.step-N.partial` and renamed only
after DCP has written its `.metadata` (which it writes last): an interrupted save leaves
a dot-folder that `load_latest` never considers.

Per-rank state (data loader position, RNG states) is stored under `ranks.rank_<r>`, one
opaque entry per rank, because each rank's value differs and DCP would otherwise keep
only one rank's copy of a non-tensor value.

Resuming on another world size works: DCP reshards model and optimizer DTensors to the new
mesh (pipeline stages too: each stage saves the parameters it holds under the whole model's names), a rank without a saved entry of its own takes rank 0's, and the data position
carries over when the global batch (batch_size x data-parallel ranks) is unchanged,
because loaders address rows by global batch index (see titan_core/data/loader.py).

A [lora] run on a `checkpoint.initial_hf` base leaves its frozen base out (DCP's `ignore_frozen_params`):
the base is on disk already and is loaded from there again on a resume, so a checkpoint holds the
adapters, the saved modules, their AdamW state and the positions, a fraction of the model's bytes.
Its `frozen_base` entry names the base; a resume or export onto another base is refused.

Hugging Face weights live beside it: the initial load in hf_load.py, the export in hf_export.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.runtime.distributed import group_rank

__all__ = ["Checkpointer", "rng_state", "set_rng_state"]

_STEP_DIR = re.compile(r"step-(\d+)")
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
"""The optimizer's hyperparameters stored per parameter (`param_groups.<fqn>.lr`), not as one list of groups:
DCP keeps one rank's copy of a non-tensor value, and pipeline stages hold different parameters, so each
stage's groups must be keys of their own (a stage given another's groups loses its learning rate)."""
TRAINED = StateDictOptions(ignore_frozen_params=True, strict=False)
"""A [lora] checkpoint's model state: what trains (strict off: the frozen base is loaded from initial_hf;
DCP's own load still fails on a trained key the checkpoint lacks)."""
FROZEN = "frozen_base"
"""A [lora] checkpoint's entry: the resolved checkpoint.initial_hf its frozen base (left out) came from."""


def frozen_base_of(cfg: JobConfig) -> str:
    """The base a [lora] run's checkpoints leave out: its resolved `checkpoint.initial_hf` ('' for any other run,
    and for a LoRA run on a seeded base, which its checkpoints then hold)."""
    return str(Path(cfg.checkpoint.initial_hf).resolve()) if cfg.lora.enable and cfg.checkpoint.initial_hf else ""


def _saved_base(path: Path, saved: dict, frozen_base: str) -> str:
    """The base `path`'s checkpoint left out ('' when it holds the whole model); ConfigError when it left one
    out and this run's base (`frozen_base`) is not that one."""
    if FROZEN not in saved:
        return ""
    state = {FROZEN: ""}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=path)
    if state[FROZEN] != frozen_base:
        now = f"this run's base is {frozen_base}" if frozen_base else "this run loads no base ([lora] on checkpoint.initial_hf)"
        raise ConfigError(f"checkpoint {path} holds a LoRA run's adapters trained on the frozen base {state[FROZEN]}, "
                          f"which it leaves out; {now}")  # fmt: skip
    return state[FROZEN]


def schedule_position(lr_scheduler) -> dict[str, int]:
    """What a checkpoint keeps of the learning-rate schedule: how far it is. Not its per-group lists (base and
    last lrs): DCP keeps one rank's copy of a non-tensor value, and pipeline stages hold different numbers of
    AdamW groups (one pair per block); the groups' learning rates travel with the optimizer's hyperparameters."""
    return {"last_epoch": lr_scheduler.last_epoch, "_step_count": lr_scheduler._step_count}


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _dist_on():
        dist.barrier()


@contextlib.contextmanager
def _single_process_ok():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from on this rank."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    random.setstate(state["python"])
    # A resume on other hardware cannot be bit-exact anyway; restore what exists on both sides.
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _publish(tmp: Path, final: Path) -> None:
    """Make a fully written checkpoint visible under its final name."""
    old = final.with_name(f".{final.name}.old")
    if final.exists():  # re-saving a step: keep the old one until the new one is in place
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


class Checkpointer:
    """Saves `folder/step-N` every `interval` steps (and at the last one) and resumes from the newest.

    `enable = False` turns both saving and resuming off, so a run with checkpoints off
    never picks up a stale folder. `interval <= 0` saves only at the last step.
    """

    def __init__(self, folder: Path, interval: int, enable: bool, frozen_base: str = ""):
        self.folder = Path(folder)
        self.interval = interval
        self.enable = enable
        self.frozen_base = frozen_base
        """`frozen_base_of`: a [lora] run's base, left out of its checkpoints; '' for the whole model."""

    @classmethod
    def from_config(cls, cfg: JobConfig) -> Checkpointer:
        """A relative `checkpoint.folder` lives under `metrics.output_dir`."""
        folder = Path(cfg.checkpoint.folder)
        if not folder.is_absolute():
            folder = Path(cfg.metrics.output_dir) / folder
        return cls(folder, cfg.checkpoint.interval, cfg.checkpoint.enable, frozen_base_of(cfg))

    # ---- saving --------------------------------------------------------------------
    def should_save(self, step: int, last: bool = False) -> bool:
        return self.enable and (last or (self.interval > 0 and step % self.interval == 0))

    def maybe_save(self, step: int, *, model, optimizer, lr_scheduler, data_loader, last: bool = False) -> Path | None:
        """Save after optimizer step `step` when due; returns the checkpoint folder or None."""
        if not self.should_save(step, last):
            return None
        return self.save(step, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, data_loader=data_loader)

    def save(self, step: int, *, model, optimizer, lr_scheduler, data_loader) -> Path:
        """Write `folder/step-N` atomically (see the module docstring). Collective under a process group."""
        final = self.folder / f"step-{step}"
        tmp = self.folder / f".step-{step}.partial"
        if group_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # debris of an earlier interrupted save
            self.folder.mkdir(parents=True, exist_ok=True)
        _barrier()
        per_rank = {"step": step, "rng": rng_state()}
        if data_loader is not None:
            per_rank["data_loader"] = data_loader.state_dict()
        buf = io.BytesIO()
        torch.save(per_rank, buf)
        state = {
            "model": get_model_state_dict(model, options=TRAINED if self.frozen_base else None),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=FLAT),
            "ranks": {f"rank_{group_rank()}": buf.getvalue()},
        }
        if self.frozen_base:
            state[FROZEN] = self.frozen_base
        if lr_scheduler is not None:
            state["lr_scheduler"] = schedule_position(lr_scheduler)
        with _single_process_ok():
            dcp.save(state, checkpoint_id=tmp)
        _barrier()
        if group_rank() == 0:
            _publish(tmp, final)
        _barrier()
        return final

    # ---- loading -------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (one with DCP's `.metadata`), or None."""
        if not self.folder.is_dir():
            return None
        steps = [
            int(m.group(1))
            for p in self.folder.iterdir()
            if (m := _STEP_DIR.fullmatch(p.name)) and (p / ".metadata").is_file()
        ]
        return max(steps, default=None)

    def load_latest(self, *, model, optimizer, lr_scheduler, data_loader) -> int | None:
        """Restore everything from the newest checkpoint; returns its step, or None when there is none."""
        if not self.enable:
            return None
        step = self.latest_step()
        if _dist_on():  # every rank must open the same folder even if the listing races a save
            box = [step]
            dist.broadcast_object_list(box, src=0)
            step = box[0]
        if step is None:
            return None
        self.load(step, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, data_loader=data_loader)
        return step

    def load(self, step: int, *, model, optimizer, lr_scheduler, data_loader) -> None:
        path = self.folder / f"step-{step}"
        key = f"rank_{group_rank()}"
        saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        if f"ranks.{key}" not in saved:
            key = "rank_0"  # saved by fewer ranks: every rank's position is rank 0's (see module docstring)
        if f"ranks.{key}" not in saved:
            raise ConfigError(
                f"checkpoint {path} has no per-rank state (no ranks.rank_0): it was not written by titan_core"
            )
        options = TRAINED if _saved_base(path, saved, self.frozen_base) else None  # a LoRA run's: the base is loaded
        state: dict[str, Any] = {
            "model": get_model_state_dict(model, options=options),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=FLAT),
            "ranks": {key: b""},
        }
        if lr_scheduler is not None:
            state["lr_scheduler"] = schedule_position(lr_scheduler)
        with _single_process_ok():
            dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"], options=options)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=FLAT)
        if lr_scheduler is not None:  # the groups' learning rates came back with the optimizer's hyperparameters
            lr_scheduler.last_epoch = state["lr_scheduler"]["last_epoch"]
            lr_scheduler._step_count = state["lr_scheduler"]["_step_count"]
            lr_scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
        per_rank = torch.load(io.BytesIO(state["ranks"][key]), weights_only=True)
        if per_rank["step"] != step:
            raise ConfigError(f"checkpoint {path} holds step {per_rank['step']}, not {step}: the folder was renamed")
        if data_loader is not None:
            _restore_loader(data_loader, per_rank["data_loader"], path)
        set_rng_state(per_rank["rng"])


def _restore_loader(loader, state: dict[str, Any], path: Path) -> None:
    """Load a loader position saved on this rank, or on another data-parallel layout."""
    mine = loader.state_dict()
    layout = ("dp_rank", "dp_world", "batch_size")
    if all(state.get(k) == mine.get(k) for k in layout) or not all(k in state for k in layout):
        loader.load_state_dict(state)  # same layout (or a loader without one): its own checks apply
        return
    before, now = state["batch_size"] * state["dp_world"], mine["batch_size"] * mine["dp_world"]
    if before != now:
        raise ConfigError(
            f"cannot resume {path} here: its global batch is batch_size {state['batch_size']} x "
            f"{state['dp_world']} data-parallel rank(s) = {before} rows, this run's is {mine['batch_size']} x "
            f"{mine['dp_world']} = {now}; keep their product equal when changing the world size"
        )
    loader.load_state_dict({**state, **{k: mine[k] for k in layout}})


def load_model_weights(path: str | Path, model, *, frozen_base: str = "") -> None:
    """Only the model's weights from the checkpoint folder `path` (`folder/step-N`), e.g. to export
    them; DCP reshards them to however `model` is laid out (plain tensors in one process). A [lora]
    checkpoint leaves its base out: `model` must hold it already, loaded from `frozen_base` (`frozen_base_of`)."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise ConfigError(f"{path} is not a complete checkpoint (no DCP .metadata in it)")
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    options = TRAINED if _saved_base(path, saved, frozen_base) else None
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=options)}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"], options=options)
