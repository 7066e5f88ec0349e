"""Count the collectives (and their bytes) a region of code issues.

`CommCounter` counts like `torch.distributed.tensor.debug.CommDebugMode` (a dispatch
mode that lets DTensor lower to collectives first, then records functional and c10d
collectives) but without CommDebugMode's per-module tracker: on torch 2.13 that tracker
corrupts its own state from the second use on when a model is entered through a method
other than `forward` (the trainer calls `model.loss`), and the counts are all we need.
tests/core/dist checks on one step that both agree where CommDebugMode works.

Bytes are the logical payload of each collective: the full tensor an all-gather
assembles, the full tensor a reduce-scatter reduces, the tensor an all-reduce reduces.
With n ranks on a ring each rank sends (n - 1) / n of that (twice for an all-reduce).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_FUNCTIONAL = {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd"}
_FUNCTIONAL_COLLECTIVES = {
    "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_reduce", "all_reduce_", "all_reduce_coalesced",
    "all_reduce_coalesced_", "all_to_all_single", "broadcast", "broadcast_",
}  # fmt: skip
# c10d op names -> the functional name they are counted under
_C10D = {
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
    "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce_coalesced",
    "alltoall_base_": "all_to_all_single",
    "alltoall_": "all_to_all",
    "broadcast_": "broadcast",
    "gather_": "gather",
    "scatter_": "scatter",
    "reduce_": "reduce",
}


def _nbytes(x) -> int:
    leaves, _ = tree_flatten(x)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _collective_name(func) -> str | None:
    namespace = getattr(func, "namespace", "")
    name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else ""
    if namespace in _FUNCTIONAL and name in _FUNCTIONAL_COLLECTIVES:
        return name
    if namespace == "c10d":
        return _C10D.get(name)
    return None


class CommCounter(TorchDispatchMode):
    """`with CommCounter() as c: ...`, then `c.counts()` -> {"all_gather_into_tensor": n, ...} and `c.bytes()`."""

    def __init__(self):
        super().__init__()
        self._counts: dict[str, int] = defaultdict(int)
        self._bytes: dict[str, int] = defaultdict(int)
        self._dtypes: dict[str, set[str]] = defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor lower the op; its collectives come back through here
        out = func(*args, **kwargs)
        name = _collective_name(func)
        if name is not None:
            self._counts[name] += 1
            self._bytes[name] += max(
                [_nbytes(a) for a in args] + [_nbytes(v) for v in kwargs.values()] + [_nbytes(out)]
            )
            leaves, _ = tree_flatten((args, kwargs, out))
            self._dtypes[name].update(
                str(t.dtype).removeprefix("torch.") for t in leaves if isinstance(t, torch.Tensor)
            )
        return out

    def counts(self) -> dict[str, int]:
        """Collectives issued, by functional op name (all_gather_into_tensor, reduce_scatter_tensor, all_reduce...)."""
        return dict(self._counts)

    def dtypes(self) -> dict[str, list[str]]:
        """Dtypes of the tensors each kind of collective moved (e.g. the mixed-precision reduce dtype)."""
        return {name: sorted(d) for name, d in self._dtypes.items()}

    def bytes(self) -> dict[str, int]:
        """Logical payload bytes by op name (see the module docstring)."""
        return dict(self._bytes)
