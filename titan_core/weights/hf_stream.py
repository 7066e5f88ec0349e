"""A model's weights under their HF names, one full tensor at a time: what an inference engine's
`load_weights(iterable)` takes, and what the HF export writes (training/hf_export.py).

`stream_plan(model, adapter)` runs the adapter's `to_hf` on meta tensors of the model's state dict,
so a model the adapter cannot map is refused before any collective; `StreamPlan.weights()` then
yields `(hf name, tensor)`:

- an HF tensor that is a native tensor renamed, or a view of one (a transpose, one expert of a
  stack), is made from that one native tensor, gathered alone (`full_tensor()` of a DTensor: a
  collective every rank joins, in the same order) and dropped once its HF tensors are yielded;
- the others (a concatenation of several natives) are made by `to_hf` on real tensors, one layer
  group at a time (names sharing the prefix up to their first number, `layers.7.`).

So beyond its shards a rank holds one gathered parameter at a time (one layer group's, for an adapter
that concatenates), and what it yields is its own: a consumer that keeps nothing keeps the stream's
peak there (tests/core/dist/test_hf_weights_two_ranks.py holds it). The communication backend may keep a
finished gather's output a moment longer: gloo drops its reference on its worker thread, which may run
only after the caller has gone on, so a consumer that never pauses between tensors can see an earlier
gather still alive at the next one. Under a process group every rank iterates the whole stream; with
`dst` only that rank is given the tensors (the others run the gathers and yield nothing), which is what
an export or a single inference engine needs.

`stream_plan(..., tensors=, deltas=)` streams other tensors than the model's state dict under the
same names, and adds to a tensor what its delta gives: shard to shard before the gather when the delta
is a DTensor on the tensor's mesh (redistributed to its placements first), else to the gathered tensor
(the delta gathered too). A [lora] run's merged weights (titan_core/lora/stream.py) are the base weights plus each adapter's B @ A.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from titan_core.models.common.tied import stored_once
from titan_core.runtime.distributed import group_rank
from titan_core.weights.name_mapping import layer_groups


@dataclass
class StreamPlan:
    """Which native tensors make which HF tensors (module docstring); `weights()` streams them."""

    own: dict[str, torch.Tensor]
    """The model's state dict (parameters as they are held: a DTensor is its shard)."""
    adapter: object
    direct: dict[str, list[tuple[str, torch.Tensor]]]
    """{native: [(hf name, meta view of it)]}, in the model's order."""
    groups: list[tuple[list[str], list[str]]]
    """[(natives, hf names)] made by `to_hf` on real tensors, one layer group (or the whole model) each."""
    deltas: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict)
    """{native: what to add to its full tensor}: called on every rank (a sharded delta is a collective)."""

    def weights(self, *, dst: int | None = None, device: torch.device | str | None = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
        """`(hf name, full tensor)` one at a time (module docstring); `dst`: the only rank given them (None:
        every rank); `device`: where the yielded tensors live (None: the model's device). Collective
        under a process group: every rank drives the whole iteration."""
        mine = dst is None or group_rank() == dst
        for native, outputs in self.direct.items():
            own, delta = self.own[native], self.deltas[native]() if native in self.deltas else None
            if _on_mesh_of(delta, own):  # laid out as the weight (redistributed so), added shard to shard, the sum gathered
                if delta.placements != own.placements:
                    delta = delta.redistribute(own.device_mesh, own.placements)
                own, delta = own.detach() + delta.to(own.dtype), None
            elif delta is not None:
                delta = _gather(delta, mine, device)
            full = _gather(own, mine, device)
            if delta is not None and mine:  # a new tensor: `full` may be the model's own weight
                full = full + delta.to(full.dtype)
            del own, delta
            if mine:
                for h, view in outputs:
                    yield h, _strided(full, view)
            del full
        for natives, names in self.groups:
            fulls = {n: _gather(self.own[n], mine, device) for n in natives}
            if mine:
                made = self.adapter.to_hf(fulls)
                for h in names:
                    yield h, _owned(made[h])
            del fulls


def stream_plan(model: nn.Module, adapter, *, tensors: dict[str, torch.Tensor] | None = None,
                deltas: dict[str, Callable[[], torch.Tensor]] | None = None) -> StreamPlan:  # fmt: skip
    """The plan of `model`'s HF weights through `adapter` (its `to_hf`, run on meta: an AdapterError
    here is every rank's, before any collective); `tensors`: the native tensors to stream in place of
    the model's state dict; `deltas`: {native: added to it} (module docstring), each a tensor the adapter
    renames (a delta to a concatenation or a conversion is refused here, ValueError)."""
    own = dict(model.state_dict(keep_vars=True)) if tensors is None else dict(tensors)
    meta = meta_of(own)
    hf_meta = stored_once(adapter.to_hf(meta))
    direct, groups = _plan(adapter, meta, hf_meta)
    deltas = dict(deltas or {})
    renamed = {n for n, outputs in direct.items() if len(outputs) == 1 and outputs[0][1] is meta[n]}
    unrenamed = sorted(set(deltas) - renamed)
    if unrenamed:
        raise ValueError(f"a delta is added only to a tensor the adapter renames; {unrenamed} are not")
    return StreamPlan(own, adapter, direct, groups, deltas)


def hf_weights(model: nn.Module, adapter, *, dst: int | None = None,
               device: torch.device | str | None = "cpu") -> Iterator[tuple[str, torch.Tensor]]:  # fmt: skip
    """`stream_plan(model, adapter).weights(dst=dst, device=device)`: e.g.
    `engine.load_weights(hf_weights(trainer.model, adapter))` after a step."""
    return stream_plan(model, adapter).weights(dst=dst, device=device)


def _owned(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous and alone in its storage (safetensors refuses tensors sharing one; a consumer that
    keeps it keeps nothing else)."""
    t = t.detach().contiguous()
    return t if t.untyped_storage().nbytes() == t.nbytes else t.clone()


def _gather(t: torch.Tensor, keep: bool, device) -> torch.Tensor | None:
    """The full tensor of `t` where `keep` (None elsewhere); a collective for a DTensor."""
    with torch.no_grad():  # here, not around the generator: a yield would carry no_grad into the consumer
        full = t.full_tensor() if isinstance(t, DTensor) else t
        if not keep:
            return None
        return full.detach().to(device) if device is not None else full.detach()


def _on_mesh_of(delta: torch.Tensor | None, t: torch.Tensor) -> bool:
    """Whether `delta` is a DTensor of the DTensor `t`'s shape on its mesh (placements aside)."""
    return (isinstance(delta, DTensor) and isinstance(t, DTensor) and delta.device_mesh == t.device_mesh
            and delta.shape == t.shape)  # fmt: skip


def _strided(full: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The HF tensor that meta `view` is of its native source, taken from the real `full`."""
    return _owned(full.contiguous().as_strided(tuple(view.shape), view.stride(), view.storage_offset()))


def meta_of(own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Meta tensors of a state dict's global shapes and dtypes; a tensor under two names (a tied
    head) stays one meta tensor under both, as the adapters' tie rules expect (and what an adapter made
    of which is then told by identity)."""
    made: dict[int, torch.Tensor] = {}
    out = {}
    for name, t in own.items():
        if id(t) not in made:
            made[id(t)] = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
        out[name] = made[id(t)]
    return out


def _plan(adapter, meta: dict[str, torch.Tensor], hf_meta: dict[str, torch.Tensor]):
    """({native: [(hf name, meta view)]} of the HF tensors made from one native tensor,
    [(natives, hf names)] of those `to_hf` makes from a layer group, or from everything)."""
    first = {}
    for name, t in meta.items():
        first.setdefault(id(t), name)
    direct: dict[str, list[tuple[str, torch.Tensor]]] = {}
    pending = []
    for h, t in hf_meta.items():
        src = first.get(id(t)) or (first.get(id(t._base)) if t._base is not None else None)
        if src is not None:
            direct.setdefault(src, []).append((h, t))
        else:
            pending.append(h)
    ordered = {n: direct[n] for n in meta if n in direct}  # the model's order: embedding, layers, head
    if not pending:
        return ordered, []
    prefixes = layer_groups(meta)
    owner: dict[str, str] = {}
    for prefix, names in prefixes.items():
        try:
            made = adapter.to_hf({n: meta[n] for n in names})
        except Exception:  # an adapter that maps only the whole model: the fallback group below
            continue
        for h in made:
            owner.setdefault(h, prefix)
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for h in pending:
        prefix = owner.get(h)
        key = "*" if prefix is None else prefix
        groups.setdefault(key, (list(meta) if prefix is None else prefixes[prefix], []))[1].append(h)
    return ordered, list(groups.values())
