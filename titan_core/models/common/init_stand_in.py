"""Stand-ins for a model's parameters while its own `init_weights` runs against shards.

titan_core/parallel/sharded_init.py makes a parallelised meta model real as each rank's shards
and must still give them the one-process init's values. It puts a `StandIn` stand-in where each
parameter was: a wrapper tensor of the full shape, dtype and device with no storage. The first
op that touches one gives it a full tensor (it is then "open"), filled with the not-yet-written
mark (NaN; the lowest integer), and the op runs on that tensor, consuming the generator exactly as
on the one-process model. When a new parameter would take the open ones past the budget (the
largest single module's own parameters), those touched longest ago are closed:
`InitRecord.write(target, full)` puts this rank's slice into the shard and the full tensor is
freed. So a rank never holds more full bytes than one module's own parameters.

Models read three helpers (the transformers path, whose init marks and re-ties tensors):
`is_stand_in`, `stand_in_unwritten` (whether an init wrote a stand-in's parameter, without touching it)
and `stand_in_like` (a stand-in to draw into and drop: a tied head untied while initialising).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._pytree import tree_map

from titan_core.config.loader import ConfigError


class ShardedInitError(ConfigError):
    """The model's init cannot be reproduced on shards (it returns to a closed parameter that cannot
    be gathered exactly, or leaves one unwritten): a ConfigError, exit 2."""


@dataclass(eq=False)
class Slot:
    """One parameter of the model while its init runs."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    """The dtype the one-process init draws it in (the meta model's, before any cast)."""
    device: torch.device
    target: nn.Parameter | None
    """The materialised parameter its values go to (a DTensor shard, or a plain replicated
    tensor); None: no module on this rank keeps it (drawn and dropped)."""
    state: str = "new"
    """new (not touched), open (a full tensor exists), closed (its slice was written)."""
    full: torch.Tensor | None = None
    unwritten_at_close: bool = False

    @property
    def nbytes(self) -> int:
        return self.shape.numel() * self.dtype.itemsize


@dataclass
class InitRecord:
    """One sharded initialisation: its stand-ins, and the full bytes it may hold and held at once."""

    budget_bytes: int
    """The most full bytes open at once: the largest single module's own parameters (a parameter
    several modules share counts in each). When a new parameter would pass it, the parameters
    touched longest ago are closed first, so an init that finishes one module before the next
    (and a shared bias touched by two modules in a row) never touches a closed one."""
    draw: bool = True
    """False: every parameter is about to be loaded (a checkpoint), so the init's draws are skipped: a
    stand-in runs its ops on a meta tensor (no memory, nothing drawn, nothing written); the buffers the
    init computes are still computed."""
    write: Callable[[torch.Tensor, torch.Tensor], None] = lambda target, full: target.copy_(full)
    """Puts a closed parameter's values (the full tensor) into its target (this rank's slice)."""
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda target: target
    """The whole parameter from its target (a collective for a shard: `DTensor.full_tensor`)."""
    reopened: list[str] = field(default_factory=list)
    """Parameters the init returned to after they were closed (gathered whole again)."""
    peak_full_bytes: int = 0
    """The most bytes of full parameter tensors held at once (<= budget_bytes)."""
    slots: list[Slot] = field(default_factory=list)
    _open: list[Slot] = field(default_factory=list)
    """The open parameters, the one touched longest ago first."""

    def realise(self, slot: Slot) -> torch.Tensor:
        if slot.state == "open":
            self._open.remove(slot)
            self._open.append(slot)
            return slot.full
        while self._open and sum(s.nbytes for s in self._open) + slot.nbytes > self.budget_bytes:
            self._close(self._open.pop(0))
        if not self.draw:
            full = torch.empty(slot.shape, dtype=slot.dtype, device="meta")
        elif slot.state == "closed":
            full = self._reopened(slot)
        else:  # marked as not yet written, as the one-process transformers path marks every tensor first
            full = torch.full(slot.shape, unwritten_mark(slot.dtype), dtype=slot.dtype, device=slot.device)
        slot.full, slot.state = full, "open"
        self._open.append(slot)
        if self.draw:  # a meta stand-in holds no memory
            self.peak_full_bytes = max(self.peak_full_bytes, sum(s.nbytes for s in self._open))
        return slot.full

    def _reopened(self, slot: Slot) -> torch.Tensor:
        """A closed parameter the init returns to (a module whose init writes its child's weight after the
        child's own init: Mamba's mixer), whole again from the shards: every rank runs the same init, so
        every rank gathers it at the same moment. Exact only while the shards hold the init's dtype."""
        if slot.target is None or slot.target.dtype != slot.dtype:
            where = "no module of this rank keeps it" if slot.target is None else (
                f"its shards hold {slot.target.dtype}, not the {slot.dtype} the init computes in")
            raise ShardedInitError(
                f"init_weights returns to {slot.name} after it went on to other parameters, and {where}, so a "
                "sharded build cannot reproduce this init; initialise each module's parameters together, or "
                "train in the init's dtype (training.dtype)"
            )
        self.reopened.append(slot.name)
        return self.gather(slot.target).clone()

    def close_open(self) -> None:
        """Write every open parameter's slice into its shard and free its full tensor."""
        while self._open:
            self._close(self._open.pop(0))

    def _close(self, slot: Slot) -> None:
        if not self.draw:
            slot.full, slot.state = None, "closed"
            return
        with torch.no_grad():
            slot.unwritten_at_close = is_unwritten_value(slot.full)
            if slot.target is not None:
                self.write(slot.target, slot.full)
        slot.full, slot.state = None, "closed"


def unwritten_mark(dtype: torch.dtype):
    """The fill of a tensor no init wrote yet: NaN, or the lowest integer (bool: False)."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return False if dtype == torch.bool else torch.iinfo(dtype).min


def is_unwritten_value(t: torch.Tensor) -> bool:
    """Whether `t` still holds nothing but the not-yet-written fill (an empty or bool tensor: never)."""
    if not t.numel() or t.dtype == torch.bool:
        return False
    mark = unwritten_mark(t.dtype)
    return bool(torch.isnan(t).all()) if isinstance(mark, float) else bool((t == mark).all())


class StandIn(nn.Parameter):
    """A parameter's stand-in while the init runs: the full shape, no storage (module docstring)."""

    @staticmethod
    def __new__(cls, slot: Slot, record: InitRecord | None = None):
        return torch.Tensor._make_wrapper_subclass(
            cls, slot.shape, dtype=slot.dtype, device=slot.device, requires_grad=False
        )

    def __init__(self, slot: Slot, record: InitRecord | None = None):
        if record is None:  # nn.Parameter(stand_in): the detach below made this one, slot and record set
            return
        self.slot = slot
        self.record = record

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default and isinstance(args[0], StandIn):
            # `.data` and nn.Parameter(lazy) detach: the same parameter, still untouched
            return StandIn(args[0].slot, args[0].record)
        if func in _LIKE_FACTORIES and isinstance(args[0], StandIn):
            # a new tensor shaped like the parameter reads none of its values: not a touch
            proto = torch.empty(args[0].shape, dtype=args[0].dtype, device="meta")
            if kwargs.get("device") is None:
                kwargs = {**kwargs, "device": args[0].device}
            return func(proto, *args[1:], **kwargs)

        def real(t):
            return t.record.realise(t.slot) if isinstance(t, StandIn) else t

        return func(*tree_map(real, args), **tree_map(real, kwargs))

    def __repr__(self) -> str:
        return f"StandIn({self.slot.name}, {tuple(self.shape)}, {self.dtype})"


_LIKE_FACTORIES = {
    torch.ops.aten.empty_like.default,
    torch.ops.aten.zeros_like.default,
    torch.ops.aten.ones_like.default,
}


def is_stand_in(t: torch.Tensor) -> bool:
    """Whether `t` is a parameter's stand-in of a sharded init in progress."""
    return isinstance(t, StandIn)


def stand_in_unwritten(t: torch.Tensor) -> bool:
    """For a stand-in: whether no init has written its parameter yet (without touching it)."""
    slot = t.slot
    if not t.record.draw:  # every parameter is loaded next: none needs a value of its own
        return False
    if slot.state == "new":
        return True
    if slot.state == "open":
        return is_unwritten_value(slot.full)
    return slot.unwritten_at_close


def stand_in_like(t: torch.Tensor) -> nn.Parameter:
    """A new parameter shaped like `t` for an init to draw into and drop (a tied head untied
    while initialising): under a sharded init a stand-in no rank keeps, else `torch.empty_like`."""
    if not isinstance(t, StandIn):
        return nn.Parameter(torch.empty_like(t), requires_grad=t.requires_grad)
    slot = Slot(f"{t.slot.name} (untied copy)", t.shape, t.dtype, t.device, None)
    t.record.slots.append(slot)
    return StandIn(slot, t.record)
