"""Will the gates' runs fit on the device a new workspace is set up for? `new-model` asks, and
derives a twin (onboard/sizing/twin/derive.py) when the full model does not fit.

The answer comes from titan_core's memory model (titan_core/memory/estimate.py), the one the
trainer refuses oversized runs with, applied to the workspace's own recipe and the model
built on the meta device. The rule (`gate_fit`): the model fits when every gate run that
holds the whole model fits its share of the device, of which two are the largest:

- eager (and parity, compile, graph_trainer, kernels: one process at the recipe's batch);
- simple_fsdp: W processes (2 on a CPU, sharing the host's memory; one per GPU), each
  materialising the whole model in fp32 before it shards it, at batch / W rows each.

The tuning rung's larger batches are checked by the trainer itself before each run
(titan_core/memory/preflight.py), as every run is. A twin is sized to the debug models' cost
(so eager and parity take seconds on a CPU) and then checked by the same rule.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from typing import Any

import torch

from onboard.errors import BadInput
from onboard.rungs.gate_recipe import world_size
from onboard.sizing.twin.derive import TwinError, derive_twin
from titan_core.config import from_dict
from titan_core.memory.budget import device_budget
from titan_core.memory.estimate import format_bytes
from titan_core.memory.preflight import estimate_for
from titan_core.models import get_family
from titan_core.models.common.hf_adapter import AdapterError
from titan_core.models.registry import build_meta
from titan_core.parallel import Degrees


@dataclass
class GateFit:
    """The tightest gate run against its budget."""

    fits: bool
    run: str
    """Which gate run is the tightest, e.g. "simple_fsdp (2 processes on this host)"."""
    estimate: Any
    """titan_core.memory.estimate.MemoryEstimate of that run."""
    budget: Any
    """titan_core.memory.budget.Budget of one of its processes."""
    device: str

    def describe(self) -> str:
        return (
            f"{self.run}: {self.estimate.describe()}; the budget is {format_bytes(self.budget.bytes)} "
            f"({self.budget.source})"
        )


@dataclass
class TwinChoice:
    """What new-model decided about a twin, and the rows of its table."""

    twin: Any | None
    """onboard.sizing.twin.derive.Twin, or None when the gates run the full model."""
    reason: str
    full_fit: GateFit | None = None
    twin_fit: GateFit | None = None
    notes: list[str] = field(default_factory=list)


def _device(cfg) -> str:
    device = cfg.device.type
    if device == "auto":  # as titan_core.runtime.devices.resolve_device decides it, without starting a device
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device


def gate_fit(hf_config: dict, adapter: Any, *, recipe_text: str) -> GateFit | None:
    """The tightest of the gates' runs of the model `hf_config` describes (read by `adapter`),
    trained as `recipe_text` (the workspace's recipe.toml) sets it up; None when nothing can be
    said: the adapter cannot read the config (a port's TODO), or the device's memory is unknown
    here (a TPU whose kind nothing names, a GPU on a host without one)."""
    cfg = from_dict(tomllib.loads(recipe_text))
    try:
        args, _ = adapter.args_from_hf(hf_config)
    except (AdapterError, TypeError, ValueError):
        return None
    device = _device(cfg)
    if device == "cuda" and not torch.cuda.is_available() and not cfg.device.memory_budget_gib:
        return None  # set up on one machine for another: this one cannot say what that GPU has free
    # the family's class has the shape (a port's model.py starts as a copy of it and is not on disk yet)
    model = build_meta(cfg.model.family, args)
    world = world_size(device)
    sharded = copy.deepcopy(cfg)
    sharded.parallelism.data_parallel = "simple_fsdp"
    sharded.training.batch_size = max(1, cfg.training.batch_size // world)
    runs = [
        ("eager (one process)", cfg, None, 1),
        (
            f"simple_fsdp ({world} processes" + (" on this host)" if device == "cpu" else ")"),
            sharded,
            Degrees(dp_replicate=1, dp_shard=world, tp=1),
            world if device == "cpu" else 1,
        ),
    ]
    worst: GateFit | None = None
    for label, run_cfg, degrees, local in runs:
        budget = device_budget(device, override_gib=cfg.device.memory_budget_gib, local_processes=local)
        if budget is None:
            return None
        _, _, est = estimate_for(run_cfg, model, args, device, degrees)
        fit = GateFit(est.total <= budget.bytes, label, est, budget, device)
        if worst is None or est.total / budget.bytes > worst.estimate.total / worst.budget.bytes:
            worst = fit
    return worst


def fit_warning(hf_config: dict, family: str, *, recipe_text: str) -> str | None:
    """One warning line when the full model of `hf_config` (read by `family`'s adapter) cannot
    train as `recipe_text` sets it up, on the device it names; else None (see `gate_fit`)."""
    fit = gate_fit(hf_config, get_family(family).adapter, recipe_text=recipe_text)
    return None if fit is None or fit.fits else full_model_warning(fit)


def full_model_warning(fit: GateFit) -> str:
    return (
        f"the full model cannot train on {fit.device} as this workspace is set up: {fit.describe()}, "
        "so next-step will refuse it"
    )


def choose_twin(
    hf_config: dict,
    adapter: Any,
    *,
    recipe_text: str,
    mode: str = "auto",
    layers: int | None = None,
    width: int | None = None,
) -> TwinChoice:
    """Whether the gates run on a twin (`mode`: auto | on | off), and which one.

    auto: a twin when the full model does not fit (`gate_fit`); on: always; off: never. While
    the twin does not fit either, its experts are halved (staying above top-k, and at least 4). BadInput for a
    knob out of range, or a model whose twin does not fit either.
    """
    if mode not in ("auto", "on", "off"):
        raise BadInput(f"twin mode must be auto, on or off, got '{mode}'")
    knobs = layers is not None or width is not None
    if mode == "off":
        if knobs:
            raise BadInput("--twin-layers / --twin-width shape a twin, but --no-twin asks for none")
        return TwinChoice(None, "--no-twin: the gates run the full model")
    full = gate_fit(hf_config, adapter, recipe_text=recipe_text)
    if mode == "auto" and not knobs:
        if full is None:
            return TwinChoice(None, "no estimate here (the adapter cannot read the config, or the device is unknown)")
        if full.fits:
            return TwinChoice(None, f"the full model fits the gates' runs ({full.run} is the tightest)", full)
    try:
        twin = derive_twin(hf_config, adapter, layers=layers, width=width)
        fit = gate_fit(twin.config, adapter, recipe_text=recipe_text)
        # top-k stays below the count, and 4 experts stay so the simple_fsdp rung's ep = 2 splits something
        least = max(twin.args.top_k + 1, 4)
        while fit is not None and not fit.fits and twin.args.n_experts > least:
            fewer = max(least, twin.args.n_experts // 2)
            twin = derive_twin(hf_config, adapter, layers=layers, width=width, experts=fewer)
            fit = gate_fit(twin.config, adapter, recipe_text=recipe_text)
    except TwinError as e:
        raise BadInput(str(e)) from None
    except (AdapterError, TypeError, ValueError) as e:  # a port's config its starting family cannot read
        raise BadInput(f"no twin: the {type(adapter).__name__} cannot read this config ({e})") from None
    if fit is not None and not fit.fits:
        raise BadInput(f"even the twin does not fit the gates' runs here: {fit.describe()}")
    if mode == "on" or knobs:
        why = "--twin" if mode == "on" else "--twin-layers / --twin-width"
    else:
        why = f"the full model does not fit the gates' runs: {full.describe()}"
    return TwinChoice(twin, why, full, fit)
