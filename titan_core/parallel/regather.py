"""SimpleFSDP's resharding after forward (`parallelism.reshard_after_forward`): gathered weights are not
kept for the backward but gathered again there.

Without it, every SimpleFSDP read's gathered weight lives until the backward: the matmul that uses it
saves it, so a rank holds the whole model gathered at the turn from forward to backward. With it, the
step's forward runs under autograd's saved-tensor hooks (`Regather`): when an op saves a tensor whose
storage is a gathered weight of this forward (the weight itself or a view of it, such as the
transpose a linear saves), the hook keeps a token instead (the Gather and its stored shard), and the
backward's unpack gathers the weight again, exactly (the same collective on the same shard), and
takes the same view of it. So a rank holds the gathered weights of the layer its forward or backward
is at, not the model's. Every rank runs the same backward, so the re-gathers meet in the same order.

Where it acts: the eager step (and pipeline stages). Under per-block compile the gathers run inside
the compiled graph, out of the hooks' sight, and the Graph Trainer decides what it keeps by its
memory policy: both are refused with it (check_regather).

`GatheredBytes` measures what it changes: the most bytes of gathered weights alive at once (each
gathered storage counted from its gather until the storage is freed).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch

from titan_core.config.loader import ConfigError
from titan_core.config.execution_modes import execution_mode

_OBSERVERS: list = []
"""What Gather tells of each weight it gathers (Regather, GatheredBytes); empty: nothing is told."""


def observe(local: torch.Tensor, gather, stored) -> None:
    """Gather's one call: `local` is the gathered weight of `stored` (a plain tensor). Nothing is read of it
    unless an observer is on (an eager step: a traced or compiled one never has one)."""
    if not _OBSERVERS:
        return
    if local.untyped_storage().data_ptr() == stored._local_tensor.untyped_storage().data_ptr():
        return  # nothing was gathered (no data-parallel dimension over more than one rank): the shard itself
    for o in _OBSERVERS:
        o.gathered(local, gather, stored)


class _Observer:
    def __enter__(self):
        _OBSERVERS.append(self)
        return self

    def __exit__(self, *exc):
        _OBSERVERS.remove(self)

    def gathered(self, local, gather, stored) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class _Token:
    gather: object
    stored: object
    size: tuple
    stride: tuple
    offset: int


class Regather(_Observer):
    """`with Regather(): loss = model.loss(...)`: the forward's gathered weights are saved as tokens and
    gathered again in the backward (module docstring)."""

    def __init__(self):
        self._gathered: dict[int, tuple[weakref.ref, object, object]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        super().__enter__()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        super().__exit__(*exc)
        self._gathered.clear()

    def gathered(self, local, gather, stored) -> None:
        self._gathered[local.untyped_storage().data_ptr()] = (weakref.ref(local), gather, stored)

    def _pack(self, t: torch.Tensor):
        if t.is_meta or type(t) is not torch.Tensor:
            return t
        key = t.untyped_storage().data_ptr()
        entry = self._gathered.get(key)
        if entry is None:
            return t
        ref, gather, stored = entry
        alive = ref()
        # a storage freed and its address reused by another tensor is not a gathered weight any more
        if alive is None or alive.untyped_storage().data_ptr() != key:
            del self._gathered[key]
            return t
        return _Token(gather, stored, tuple(t.size()), tuple(t.stride()), t.storage_offset())

    @staticmethod
    def _unpack(x):
        if not isinstance(x, _Token):
            return x
        with torch.no_grad():
            whole = x.gather.gather_local(x.stored)
        return whole.as_strided(x.size, x.stride, x.offset)


class GatheredBytes(_Observer):
    """`with GatheredBytes() as g: step()` then `g.peak_bytes`: the most bytes of gathered weights alive at once."""

    def __init__(self):
        self.live = 0
        self.peak_bytes = 0
        self._seen: set[int] = set()

    def gathered(self, local, gather, stored) -> None:
        storage = local.untyped_storage()
        key = storage.data_ptr()
        if key in self._seen:
            return
        self._seen.add(key)
        self.live += storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, self.live)
        weakref.finalize(storage, self._freed, key, storage.nbytes())

    def _freed(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes


def regathering(cfg):
    """The context the step's forward runs in: Regather under reshard_after_forward, else nothing."""
    return Regather() if cfg.parallelism.reshard_after_forward else contextlib.nullcontext()


def check_regather(cfg) -> None:
    """The refusals of reshard_after_forward (ConfigError, one line)."""
    p = cfg.parallelism
    if not p.reshard_after_forward:
        return
    if p.data_parallel != "simple_fsdp":
        raise ConfigError(
            f"parallelism.reshard_after_forward re-gathers SimpleFSDP's weights; data_parallel = '{p.data_parallel}' "
            "has none to re-gather (fsdp2 reshards after forward by itself); set it to false"
        )
    refused = {"compile": "per-block compile (its gathers run inside the compiled graph)",
               "graph_trainer": "the Graph Trainer (its memory_policy decides what it keeps)"}
    what = refused.get(execution_mode(cfg))
    if what is not None:
        raise ConfigError(
            f"parallelism.reshard_after_forward with {what} is not supported: it re-gathers through "
            "autograd's saved-tensor hooks in the eager step; set one of them off"
        )
