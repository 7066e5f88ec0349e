"""Peak bytes of the tensors a piece of code allocates, counted at the dispatcher.

CPUs have no allocator statistics like `torch.cuda.max_memory_allocated`, and the
process's resident set does not see a step's tensors once malloc reuses freed pages (a
second step of the same model shows a rise of a few KiB). `TensorPeak` counts instead:
every tensor an op returns adds its storage's bytes when that storage is new, and a
finalizer subtracts them when the storage is freed, so `peak_bytes` is the most tensor
memory alive at once between entering and leaving the mode (inputs and parameters that
existed before are not counted; gradients and activations saved for backward are).

Blind spots: memory an op uses internally and frees before returning (a kernel's
scratch memory), and memory owned by another runtime (JAX buffers behind a DLPack bridge) are
not seen. Backward is seen on CPU, where autograd runs it on the calling thread. A wrapper
tensor subclass (torchao's float8 tensors) owns no storage: it counts by its inner tensors, and
what its own dispatch allocates inside an op and frees is scratch memory as above.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten


class TensorPeak(TorchDispatchMode):
    """`with TensorPeak() as p: step()` then `p.peak_bytes` (and `p.live_bytes` still alive at exit)."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def _freed(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a view or an in-place result lives in an input's storage: nothing new was allocated
        inputs = {t.untyped_storage().data_ptr() for t in _holding(tree_flatten((args, kwargs))[0])}
        for t in _holding(tree_flatten(out)[0]):
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key and key not in inputs and key not in self._live:
                self._live[key] = storage.nbytes()
                self.live_bytes += storage.nbytes()
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
                # storages keep their Python object alive as long as the C++ storage lives
                weakref.finalize(storage, self._freed, key)
        return out


def _holding(values):
    """The tensors among `values` that hold storage: a wrapper subclass (torchao's float8 tensors) has
    none of its own, its inner tensors (`__tensor_flatten__`) do; meta tensors hold nothing."""
    for t in values:
        if not isinstance(t, torch.Tensor) or t.is_meta:
            continue
        if is_traceable_wrapper_subclass(t):
            yield from _holding([getattr(t, name) for name in t.__tensor_flatten__()[0]])
        else:
            yield t


def held_tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of the tensors a rank holds into its next step: its parameters (a DTensor's local shard), its buffers
    and the optimizer's state, each storage counted once. Not the gradients: a step sets them to None first
    (zero_grad), so a TensorPeak around the step counts the ones it makes."""
    seen: dict[int, int] = {}

    def add(t) -> None:
        if isinstance(t, torch.Tensor):
            local = t.to_local() if hasattr(t, "to_local") else t
            for held in _holding([local]):
                storage = held.untyped_storage()
                seen.setdefault(storage.data_ptr(), storage.nbytes())

    with torch.no_grad():
        for p in model.parameters():
            add(p)
        for b in model.buffers():
            add(b)
        for state in (optimizer.state.values() if optimizer is not None else ()):
            for value in state.values():
                add(value)
    seen.pop(0, None)  # storage-less (meta) tensors
    return sum(seen.values())
