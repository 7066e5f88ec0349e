"""Refuse a run that cannot fit before its weights are materialised.

The trainer calls `check_memory` on the meta model, swaps applied, right before `to_empty`:
a Llama-3-70B recipe on a 24 GiB host then ends in the seconds its meta build takes, with
one paragraph (exit 2) saying what the run needs, what the device has, and what would fit,
instead of an allocator error or the OOM killer minutes later.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.memory.budget import Budget, device_budget
from titan_core.memory.estimate import MemoryEstimate, ModelShape, TrainSetup, estimate_memory, format_bytes

TWIN = (
    "a smaller twin of the model for runs on this {device} (the same architecture with fewer or narrower layers, "
    "in a config.json of its own), the full model sized for its target device separately"
)
MAX_DEVICES = 1 << 16


class MemoryBudgetError(ConfigError):
    """The run's memory estimate exceeds what the device has (bad input: exit 2)."""

    def __init__(self, message: str, estimate: MemoryEstimate, budget: Budget):
        super().__init__(message)
        self.estimate, self.budget = estimate, budget


def estimate_for(
    cfg, model: nn.Module, args, device_type: str, degrees=None, *, lora_params: int = -1
) -> tuple[ModelShape, TrainSetup, MemoryEstimate]:
    """The memory estimate of `cfg` training `model` (built on meta) on a device of `device_type`;
    `lora_params`: what [lora] will train (ModelShape.lora_params)."""
    shape = replace(ModelShape.from_model(model, args), lora_params=lora_params)
    setup = TrainSetup.from_config(cfg, degrees, device_type=device_type)
    return shape, setup, estimate_memory(shape, setup)


def check_memory(cfg, model: nn.Module, args, device: torch.device, degrees=None, *,
                 lora_params: int = -1) -> MemoryEstimate:  # fmt: skip
    """The run's estimate; MemoryBudgetError when it exceeds the device's budget (no budget known: no check)."""
    shape, setup, est = estimate_for(cfg, model, args, device.type, degrees, lora_params=lora_params)
    budget = device_budget(device, override_gib=cfg.device.memory_budget_gib)
    if budget is not None and est.total > budget.bytes:
        raise MemoryBudgetError(refusal(shape, setup, est, budget, device_type=device.type), est, budget)
    return est


def refusal(shape: ModelShape, setup: TrainSetup, est: MemoryEstimate, budget: Budget, *, device_type: str) -> str:
    """One paragraph: the estimate and its parts, the budget and its source, what would fit."""
    return (
        f"the run does not fit in memory: {shape.params:,} parameters, {est.describe()}; the budget is "
        f"{format_bytes(budget.bytes)} per process ({budget.source}). What would fit: "
        + "; ".join(what_would_fit(shape, setup, budget, device_type=device_type))
        + ". (device.memory_budget_gib sets the budget by hand.)"
    )


def what_would_fit(shape: ModelShape, setup: TrainSetup, budget: Budget, *, device_type: str) -> list[str]:
    """Changes that bring the estimate under `budget`, mildest first; the twin always closes the list."""
    fits = lambda s: estimate_memory(shape, s).total <= budget.bytes  # noqa: E731
    out = []
    batch = _largest_batch(setup, fits)
    if batch:
        sequences = setup.batch_size * setup.grad_accum
        accum = -(-sequences // batch)
        keeps = "keeps the" if accum * batch == sequences else "gives at least as many"
        out.append(f"training.batch_size = {batch} (training.grad_accum = {accum} {keeps} tokens per step)")
    else:
        one = estimate_memory(shape, replace(setup, batch_size=1))
        out.append(f"no batch size (batch 1 still needs {format_bytes(one.total)})")
    policy = _fitting_policy(shape, setup, fits, device_type)
    if policy:
        out.append(policy)
    elif setup.memory_policy not in ("full", "offload"):
        out.append("no memory policy alone")
    out.append(_devices(shape, setup, budget))
    out.append(TWIN.format(device={"cpu": "CPU", "cuda": "GPU", "tpu": "TPU"}.get(device_type, device_type)))
    return out


def _largest_batch(setup: TrainSetup, fits) -> int:
    """The largest batch below the current one that fits (0: none does); the estimate grows with the batch."""
    lo, hi = 0, setup.batch_size - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(replace(setup, batch_size=mid)):
            lo = mid
        else:
            hi = mid - 1
    return lo if lo and fits(replace(setup, batch_size=lo)) else 0


def _needs_dense(shape: ModelShape, setup: TrainSetup) -> bool:
    """The captured step needs static-shape experts: the loop kernel syncs the host."""
    return shape.moe_layers > 0 and setup.moe == "loop"


def _graph(shape: ModelShape, setup: TrainSetup, policy: str) -> TrainSetup:
    """`setup` under a Graph Trainer memory policy (with the experts kernel it needs)."""
    return replace(setup, mode="graph_trainer", memory_policy=policy,
                   moe="dense" if _needs_dense(shape, setup) else setup.moe)  # fmt: skip


def _policy_flags(shape: ModelShape, setup: TrainSetup, policy: str) -> str:
    flags = f"graph_trainer.enable = true, graph_trainer.memory_policy = {policy}"
    return flags + (", kernels.moe = dense" if _needs_dense(shape, setup) else "")


def _fitting_policy(shape: ModelShape, setup: TrainSetup, fits, device_type: str) -> str | None:
    """The mildest Graph Trainer memory policy that fits at the current batch, as the flags to set."""
    # offload parks activations in host memory: on a CPU that is the same memory
    order = ("default", "offload", "full") if device_type != "cpu" else ("default", "full")
    later = order[order.index(setup.memory_policy) + 1 :] if setup.memory_policy in order else order
    for policy in later:
        if fits(_graph(shape, setup, policy)):
            return _policy_flags(shape, setup, policy)
    return None


def _fewest_devices(shape: ModelShape, setup: TrainSetup, budget: Budget) -> int:
    """The fewest FSDP2 ranks (one block's parameters gathered at a time, each rank materialising
    only its shards) that bring `setup` under `budget`; 0 when none up to MAX_DEVICES does."""

    def fits(n: int) -> bool:
        sharded = replace(setup, dp_shard=n, data_parallel="fsdp2", reshard_after_forward=False)
        return estimate_memory(shape, sharded).total <= budget.bytes

    start = n = max(2, setup.dp_shard)
    while n < MAX_DEVICES and not fits(n):
        n *= 2
    if not fits(n):
        return 0
    lo = max(start, n // 2 + 1)
    while lo < n:  # the smallest count in [lo, n] that fits
        mid = (lo + n) // 2
        if fits(mid):
            n = mid
        else:
            lo = mid + 1
    return n


def _devices(shape: ModelShape, setup: TrainSetup, budget: Budget) -> str:
    """How many devices like this one FSDP2 needs: as configured, else at batch 1 with full recompute."""
    n, how = _fewest_devices(shape, setup, budget), ""
    if not n:
        n = _fewest_devices(shape, replace(_graph(shape, setup, "full"), batch_size=1), budget)
        how = f" at training.batch_size = 1 with {_policy_flags(shape, setup, 'full')}"
    if not n:
        return f"no device count up to {MAX_DEVICES} under FSDP2"
    return f"{n} devices like this one under FSDP2 (parallelism.data_parallel = fsdp2, parallelism.dp_shard = {n}){how}"
