"""Sharded from the first byte: a parallelised meta model made real as shards, initialised as one process would.

The trainer builds the model on meta, parallelises it there (every parameter becomes a DTensor
of this rank's shard, still without storage), and only then gives it memory: `materialise_sharded`
allocates each rank's shards and runs the model's own `init_weights(seed)` against them. The
initial values must be the one-process seeded init's, bit for bit (a sharded run is compared
with one process, so both must start from the same weights), and that init draws the whole
model in order from one generator, so each rank makes every draw the one-process init makes, in
the same order, and keeps only its slice:

- while `init_weights` runs, every parameter is a stand-in with no storage
  (titan_core/models/common/init_stand_in.py); the first op that touches one gives it a full
  tensor, and the op runs on that tensor, consuming the generator exactly as on the one-process
  model;
- when the init moves on to a parameter of another module, the open ones are closed: this rank's
  slice is cut out of each (`distribute_tensor(..., src_data_rank=None)`, no communication, the
  same slicing SimpleFSDP, FSDP2, TP and EP use), cast to the stored dtype and copied into the
  shard; the full tensor is freed. A parameter no rank keeps (another pipeline stage's) is drawn
  and dropped.

**The bound.** A rank holds its shards plus the full tensors of one module's own parameters at a
time (a weight and its bias: in every model here, at most the largest parameter and a vector);
`InitRecord.peak_full_bytes` records the most it held, and tests/core/dist/test_sharded_init.py
holds it to that.

**What cannot be reproduced on shards** (ShardedInitError, a ConfigError: exit 2, nothing
written): an init that returns to a parameter after it moved on to another module's (its full
values are gone), and one that leaves a parameter unwritten (the one-process model would keep
whatever memory `to_empty` gave it, which no other run reproduces).

Why not DTensor's own random init: on CPU it does not reproduce a full-tensor draw (each rank draws
its shard from its own offset), so the sharded run would not start from the one-process weights.
Why not a seed per parameter: it would change the init every existing run and parity record was
made with, and an agent's own `init_weights` in a port would have to be rewritten to it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from titan_core.models.common.init_stand_in import InitRecord, ShardedInitError, StandIn, Slot


def _write_slice(target: torch.Tensor, full: torch.Tensor) -> None:
    if isinstance(target, DTensor):
        local = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None).to_local()
        target._local_tensor.copy_(local)  # casts to the stored dtype, as the one-process `.to(dtype)` does
    else:
        target.copy_(full)


def _whole(target: torch.Tensor) -> torch.Tensor:
    return target.full_tensor() if isinstance(target, DTensor) else target


def materialise_sharded(
    model: nn.Module,
    device: torch.device,
    seed: int,
    *,
    init_dtypes: dict[str, torch.dtype],
    cast_to: torch.dtype,
    dropped: frozenset[str] = frozenset(),
    draw: bool = True,
) -> InitRecord:
    """Give a parallelised meta `model` this rank's shards on `device` and initialise them with its
    own `init_weights(seed)`, equal to the one-process init (module docstring).

    `init_dtypes`: {parameter or buffer name: the dtype the one-process init runs in} (the meta
    model's dtypes before it was cast, `init_dtypes_of`). `cast_to`: the training dtype the
    one-process build casts the initialised model to; a buffer then goes on to the dtype it has
    now (what mixed precision made of it on meta). `dropped`: parameters no module of this rank
    keeps (another pipeline stage's): drawn in order and dropped, never materialised. `draw=False`:
    every parameter is loaded next (checkpoint.initial_hf), so only the buffers are initialised and no
    parameter is held whole even for a moment.
    """
    final = {n: b.dtype for n, b in model.named_buffers()}
    _to_empty(model, device, dropped)
    _buffers_as(model, init_dtypes)
    slots: dict[int, Slot] = {}
    restore: list[tuple[nn.Module, str, nn.Parameter]] = []
    per_module: dict[int, int] = {}
    for mod_name, module in model.named_modules():
        for pname, param in list(module._parameters.items()):
            if param is None:
                continue
            fqn = f"{mod_name}.{pname}" if mod_name else pname
            if id(param) not in slots:
                target = None if fqn in dropped else param
                slots[id(param)] = Slot(fqn, param.shape, init_dtypes.get(fqn, param.dtype), device, target)
            per_module[id(module)] = per_module.get(id(module), 0) + slots[id(param)].nbytes
            restore.append((module, pname, param))
    record = InitRecord(budget_bytes=max(per_module.values(), default=0), draw=draw, write=_write_slice,
                        gather=_whole)  # fmt: skip
    record.slots = list(slots.values())
    stand_ins = {key: StandIn(slot, record) for key, slot in slots.items()}
    for module, pname, param in restore:
        module._parameters[pname] = stand_ins[id(param)]
    try:
        with torch.no_grad():
            model.init_weights(seed=seed)
        record.close_open()
    finally:
        _put_back(model, restore)
    unwritten = [s.name for s in record.slots if s.target is not None and (s.state == "new" or s.unwritten_at_close)]
    if not draw:  # a checkpoint writes every parameter next
        unwritten = []
    if unwritten:
        raise ShardedInitError(
            f"init_weights(seed) writes no value into {', '.join(unwritten[:5])}"
            f"{' and more' if len(unwritten) > 5 else ''}: a sharded build cannot reproduce what `to_empty` "
            "left there; give every parameter an initial value in init_weights"
        )
    _buffers_as(model, final, via=cast_to)
    return record


def _put_back(model: nn.Module, restore: list[tuple[nn.Module, str, nn.Parameter]]) -> None:
    """Each module's materialised parameters in place of the stand-ins. A module the init gave another
    parameter's stand-in (a head tied to the embedding again) gets that parameter: the tie stays."""
    for module, pname, param in restore:
        now = module._parameters[pname]
        if isinstance(now, StandIn):
            if now.slot.target is None and now.slot.name.endswith("(untied copy)"):
                raise ShardedInitError(f"init_weights left {pname} of {type(module).__name__} untied from the "
                                       "parameter it shares: the sharded build keeps ties as the model has them")
            module._parameters[pname] = param if now.slot.target is None else now.slot.target


def _to_empty(model: nn.Module, device: torch.device, dropped: frozenset[str]) -> None:
    """Storage on `device` for every shard and buffer, the dropped parameters left on meta.

    A parameter several modules share on meta (a tied head, Zamba's shared block) becomes one per
    module, as `to_empty` makes it on the one-process model; the model's own init ties them again
    (transformers' `tie_weights`), and `_put_back` keeps what it tied."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for pname, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, pname))
    if not dropped:
        model.to_empty(device=device)
    else:
        _to_empty_kept(model, device, dropped)
    for group in holders.values():
        for module, pname in group[1:]:
            param = module._parameters[pname]
            if param is group[0][0]._parameters[group[0][1]]:
                module._parameters[pname] = nn.Parameter(torch.empty_like(param), param.requires_grad)


def _to_empty_kept(model: nn.Module, device: torch.device, dropped: frozenset[str]) -> None:
    for mod_name, module in model.named_modules():
        for pname, param in list(module._parameters.items()):
            fqn = f"{mod_name}.{pname}" if mod_name else pname
            if param is not None and fqn not in dropped and param.is_meta:
                module._parameters[pname] = nn.Parameter(torch.empty_like(param, device=device), param.requires_grad)
        for bname, buf in list(module._buffers.items()):
            if buf is not None and buf.is_meta:
                module._buffers[bname] = torch.empty_like(buf, device=device)


def _buffers_as(model: nn.Module, dtypes: dict[str, torch.dtype], via: torch.dtype | None = None) -> None:
    """Every buffer named in `dtypes` cast to its dtype there; floating ones through `via` first (the
    one-process build's `model.to(training dtype)` before mixed precision's own cast)."""
    for mod_name, module in model.named_modules():
        for bname, buf in list(module._buffers.items()):
            fqn = f"{mod_name}.{bname}" if mod_name else bname
            if buf is None or fqn not in dtypes:
                continue
            if via is not None and buf.is_floating_point():
                buf = buf.to(via)
            module._buffers[bname] = buf.to(dtypes[fqn])


def init_dtypes_of(model: nn.Module) -> dict[str, torch.dtype]:
    """{parameter and buffer name: dtype} of a meta model before it is cast (`init_dtypes`)."""
    return {**{n: p.dtype for n, p in model.named_parameters()}, **{n: b.dtype for n, b in model.named_buffers()}}
