"""Which part of a stored tensor a converted tensor is, found on meta, so a rank reads only its part.

Adapters convert by renames, transposes, splits and concatenations (models/common/hf_adapter.py).
Run on meta tensors, a rename hands back the input tensor itself and a transpose, a split or a
slice hands back a view of it (`_base` is the input; its strides and offset say where it walks).
`view_map` turns such a view into a `ViewMap`: each of the view's dims walks one dim of the
(contiguous) source, from a start index; the source dims it does not walk are fixed at theirs.
Then any box of the view (a rank's shard: `local_box`) is a box of the source (`source_box`),
read from the file alone, and `arrange` puts the read values in the view's order. A
concatenation or a stack makes a new tensor: no map, and the caller converts real tensors.

`local_box` is the box of the global tensor a parameter holds on this rank: all of it for a plain
tensor, the DTensor's shard (Shard / Replicate placements on any mesh) otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard


@dataclass(frozen=True)
class ViewMap:
    """A view of a contiguous source tensor, as boxes: view dim d walks source dim `dims[d]`
    (None: a size-1 dim that walks none), starting at `start[p]` on source dim p."""

    dims: tuple[int | None, ...]
    start: tuple[int, ...]


def contiguous_strides(shape) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(tuple(shape)):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def view_map(view: torch.Tensor, source: torch.Tensor) -> ViewMap | None:
    """How `view` (an adapter's output) is `source` (its input) or a box of it, possibly with dims
    permuted and size-1 dims dropped or added; None when it is anything else (a new tensor, a
    reshape that merges dims, a broadcast)."""
    if view is source:
        return ViewMap(tuple(range(source.ndim)), (0,) * source.ndim)
    if view._base is not source or not source.is_contiguous() or 0 in source.shape:
        return None
    strides = contiguous_strides(source.shape)
    rest, start = view.storage_offset(), []
    for s in strides:
        start.append(rest // s)
        rest %= s
    if any(i >= n for i, n in zip(start, source.shape)):
        return None
    dims: list[int | None] = []
    for size, stride in zip(view.shape, view.stride()):
        if size == 1:
            dims.append(None)
            continue
        walks = [p for p, s in enumerate(strides) if s == stride and source.shape[p] > 1 and p not in dims]
        if len(walks) != 1 or start[walks[0]] + size > source.shape[walks[0]]:
            return None
        dims.append(walks[0])
    return ViewMap(tuple(dims), tuple(start))


def source_box(vm: ViewMap, box: list[tuple[int, int]]) -> tuple[slice, ...]:
    """The source slices holding the view's `box` ([(offset, size)] per view dim)."""
    out = [slice(s, s + 1) for s in vm.start]
    for (offset, size), p in zip(box, vm.dims):
        if p is not None:
            out[p] = slice(vm.start[p] + offset, vm.start[p] + offset + size)
    return tuple(out)


def arrange(vm: ViewMap, data: torch.Tensor, shape) -> torch.Tensor:
    """The values read from `source_box` (source dims order) in the view's order and `shape`."""
    walked = [p for p in vm.dims if p is not None]
    order = sorted(walked)
    data = data.reshape([data.shape[p] for p in order])
    return data.permute([order.index(p) for p in walked]).reshape(tuple(shape))


def local_box(param: torch.Tensor) -> list[tuple[int, int]] | None:
    """[(offset, size)] per dim of the part of the global tensor `param` holds here; None for a
    DTensor placement other than Shard and Replicate (the caller distributes the full tensor)."""
    if not isinstance(param, DTensor):
        return [(0, int(n)) for n in param.shape]
    if not all(isinstance(p, (Shard, Replicate)) and type(p) in (Shard, Replicate) for p in param.placements):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # lazy: a private torch name (no public one), so a torch that moves it fails only a sharded load

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return [(int(o), int(n)) for o, n in zip(offset, shape)]
