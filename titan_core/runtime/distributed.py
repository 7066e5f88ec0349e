"""Process groups from the torchrun environment: init, the one-rank group, teardown.

Ranks come from RANK / WORLD_SIZE / LOCAL_RANK, set by torchrun (which titan_core.launcher starts).
The backend follows the device: gloo on CPU, nccl on CUDA (with gloo beside it for the
CPU-side objects a checkpoint exchanges). A process started without that environment
still gets a one-rank group on an in-memory store, because SimpleFSDP puts parameters on
a DeviceMesh even at world size 1 (so mixed precision has one code path).

Every collective waits at most `parallelism.timeout_s`: a dead or stuck rank then fails
the others with an error instead of a hang, and the launcher reports it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from titan_core.config.loader import ConfigError

BACKENDS = {"cpu": "gloo", "cuda": "cpu:gloo,cuda:nccl"}


@dataclass
class DistState:
    rank: int
    world_size: int
    local_rank: int
    owned: bool
    """True when this process created the group (and so must destroy it)."""


def env_ranks() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the torchrun environment; (0, 1, 0) without it."""
    try:
        return (
            int(os.environ.get("RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")),
        )
    except ValueError as e:
        raise ConfigError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers: {e}") from None


def group_rank() -> int:
    """This process's rank in the initialised process group; 0 without one (a single process)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def current_ranks() -> tuple[int, int, int]:
    """Like env_ranks, but an already initialised group's rank and size win."""
    rank, world, local_rank = env_ranks()
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), local_rank
    return rank, world, local_rank


def backend_for(device: torch.device) -> str:
    if device.type not in BACKENDS:
        raise ConfigError(
            f"no collective backend is wired for device '{device.type}' (known: {', '.join(BACKENDS)}); "
            "use parallelism.data_parallel = 'none' on one process"
        )
    return BACKENDS[device.type]


def init_distributed(device: torch.device, timeout_s: float) -> DistState:
    """Join (or create) the default process group; reuse one that already exists."""
    rank, world, local_rank = env_ranks()
    if dist.is_initialized():
        # A harness (a test, an outer program) made the group: use it and leave it alone.
        return DistState(dist.get_rank(), dist.get_world_size(), local_rank, owned=False)
    if timeout_s <= 0:
        raise ConfigError(f"parallelism.timeout_s must be > 0, got {timeout_s}")
    backend = backend_for(device)
    timeout = timedelta(seconds=timeout_s)
    if world == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise ConfigError(
                f"WORLD_SIZE={world} but {' and '.join(missing)} not set: start the run with "
                "`python -m titan_core.train --nproc N` (or a command that wraps it) or torchrun"
            )
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    return DistState(rank, world, local_rank, owned=True)


@contextlib.contextmanager
def process_group(device: torch.device, timeout_s: float):
    """`init_distributed` for a block of work that several trainers share; on leaving it the
    ranks leave together when the block ended normally (`teardown(together=True)`), else at once."""
    state = init_distributed(device, timeout_s)
    done = False
    try:
        yield state
        done = True
    finally:
        teardown(state, together=done)


def teardown(state: DistState | None, *, together: bool = False) -> None:
    """Destroy the group if this process created it (idempotent).

    `together`: the run ended normally on every rank, so they leave in order (`_leave_in_order`).
    After a failure there is no ordering: the peers may be gone.
    """
    if state is not None and state.owned and dist.is_initialized():
        if together and state.world_size > 1:
            _leave_in_order(state)
        else:
            dist.destroy_process_group()
        state.owned = False


LEAVE_WAIT_S = 30.0


def _leave_in_order(state: DistState) -> None:
    """Every rank but 0 destroys its group first and says so in the store; rank 0, whose
    process serves the store, destroys its own only once they all have (or LEAVE_WAIT_S passed).

    A rank that is still shutting down its gloo group when the store's server process goes
    away can abort with `terminate called without an active exception`: seen on 2-rank runs
    here, always rank 1 (a client of rank 0's store) after all its steps, also with a barrier
    before the destroy; rank 0 leaves a barrier and may exit while rank 1 still tears down.
    """
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    key = "titan_core/left/{}".format
    if state.rank != 0:
        dist.destroy_process_group()
        store.set(key(state.rank), "1")
        return
    try:
        store.wait([key(r) for r in range(1, state.world_size)], timedelta(seconds=LEAVE_WAIT_S))
    except (RuntimeError, dist.DistError):  # a peer that never said so: leave anyway
        pass
    dist.destroy_process_group()
