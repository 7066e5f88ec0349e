"""SimpleFSDP: sharded DTensor parameters read through a gathering parametrization.

Each parameter is stored as a DTensor on the mesh (`Shard` on `dp_shard`, `Replicate` on
`dp_replicate`, its TP placement on `tp`). Reading `module.weight` runs a property that
redistributes the stored DTensor to replicated over the data-parallel dimensions (the
all-gather, in the policy's param dtype) and hands the module a plain tensor. Autograd
of that redistribute is the reduce-scatter (all-reduce on replicated dimensions) in the
policy's reduce dtype, with `Partial("avg")` so the gradient is the data-parallel mean.
No hooks and no module wrapper: the collectives are ordinary ops a compiler can see.

The property replaces `torch.nn.utils.parametrize` on purpose: parametrize renames
parameters to `...parametrizations.weight.original`, which would change every
state-dict key, optimizer group rule and checkpoint. Here `_parameters` keeps the
original names and holds the sharded DTensors, so state dicts and DCP see the shards.

Parameters are sharded on meta (each rank's DTensor holds only its slice's shape) and given
values afterwards by titan_core/parallel/sharded_init.py, which reproduces the one-process
init one full parameter at a time; a materialised model shards the same way (each rank keeps
its own slice, no communication). Buffers (e.g. RoPE frequencies) stay plain, replicated tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from titan_core.models.common.init_stand_in import StandIn
from titan_core.parallel.regather import observe

_CLASS_CACHE: dict[tuple[type, tuple[str, ...]], type] = {}
_tp_plain = False
"""Set by `tp_reads_plain` while it is open."""


@contextlib.contextmanager
def tp_reads_plain() -> Iterator[None]:
    """While open, a tensor-parallel parameter reads as this rank's slice, a plain tensor, not the DTensor
    its TP module computes with. For code that sizes new layers by the weight it reads: peft gives a
    layer whose weight is a DTensor on a tp mesh adapters of its local shape, drawn alike on every rank;
    read plain, its layer's whole in/out features size them, drawn as one process draws them."""
    global _tp_plain
    _tp_plain, before = True, _tp_plain
    try:
        yield
    finally:
        _tp_plain = before


@dataclass(frozen=True)
class MixedPrecision:
    param_dtype: torch.dtype
    """Dtype a parameter is gathered in and computed with."""
    reduce_dtype: torch.dtype
    """Dtype gradients are reduced in (then cast back to the stored dtype)."""


class Gather:
    """Reads one stored DTensor parameter as the tensor its module computes with."""

    def __init__(
        self,
        *,
        compute: list[Placement],
        grad: list[Placement],
        mp: MixedPrecision,
        stored_dtype,
        tp_mesh: DeviceMesh | None = None,
        tp_placement: Placement | None = None,
    ):
        self.compute = compute
        self.grad = grad
        # None means "no cast": at equal dtypes the gather is exactly the stored values.
        self.forward_dtype = mp.param_dtype if mp.param_dtype != stored_dtype else None
        # the backward collective otherwise runs in the stored dtype (not the gathered one)
        self.backward_dtype = mp.reduce_dtype if mp.reduce_dtype != stored_dtype else None
        self.tp_mesh = tp_mesh
        self.tp_placement = tp_placement

    def gather_local(self, stored: DTensor) -> torch.Tensor:
        """The gathered (and cast) weight as a plain tensor: this rank's TP slice, whole over the dp ranks."""
        full = stored.redistribute(
            placements=self.compute, forward_dtype=self.forward_dtype, backward_dtype=self.backward_dtype
        )
        return full.to_local(grad_placements=self.grad)

    def reads(self, stored) -> bool:
        return isinstance(stored, DTensor)

    def __call__(self, stored: DTensor) -> torch.Tensor:
        local = self.gather_local(stored)
        observe(local, self, stored)  # reshard_after_forward and the gathered-bytes measure (regather.py)
        if self.tp_placement is None or _tp_plain:
            return local
        # A tensor-parallel weight: its TP module computes with a DTensor on the tp mesh.
        return DTensor.from_local(
            local, self.tp_mesh, [self.tp_placement], run_check=False, shape=stored.shape, stride=stored.stride()
        )


class Cast:
    """Reads a parameter of a one-process run (nothing to gather, nothing to reduce) in the compute dtype.

    On a mesh of one rank a gather is the stored tensor itself and the gradient's mean is over one
    rank: a DTensor would only add its dispatch to every read, gradient and optimizer op (about 10%
    of the demo model's eager step). So the parameter stays a plain tensor, read through `.to`,
    whose backward casts the gradient to the stored dtype as the reduce would."""

    def __init__(self, mp: MixedPrecision):
        self.dtype = mp.param_dtype

    def reads(self, stored) -> bool:
        # a sharded init's stand-in (sharded_init.py) is read as itself while the init writes it; anything
        # else in the slot (the parameter, a traced step's functional stand-in for it) is cast
        return not isinstance(stored, StandIn)

    def __call__(self, stored: torch.Tensor) -> torch.Tensor:
        return stored.to(self.dtype)


def _gathered_class(base: type, names: tuple[str, ...]) -> type:
    key = (base, names)
    if key not in _CLASS_CACHE:

        def reader(name):
            def read(self):
                stored = self._parameters[name]
                gather = self._simple_fsdp_gathers[name]
                # not a DTensor only while a sharded init runs (sharded_init.py): the full stand-in itself
                return gather(stored) if gather.reads(stored) else stored

            return property(read)

        _CLASS_CACHE[key] = type(f"SimpleFSDP{base.__name__}", (base,), {n: reader(n) for n in names})
    return _CLASS_CACHE[key]


def _dp_shard_dim(param: torch.Tensor, tp_placement: Placement | None) -> int | None:
    """Tensor dim to shard over dp_shard: 0, unless TP already shards it (then the next one)."""
    taken = tp_placement.dim if isinstance(tp_placement, Shard) else None
    for d in range(param.ndim):
        if d != taken:
            return d
    return None  # a 1-D tensor TP already shards (e.g. a column-parallel bias): replicate it over dp


def _placements(param: torch.Tensor, mesh: DeviceMesh, tp_placement: Placement | None, tp_partial_grad: bool):
    """(stored, compute, grad) placements, one per mesh dimension."""
    stored, compute, grad = [], [], []
    for name in mesh.mesh_dim_names:
        if name == "dp_replicate":
            stored.append(Replicate())
        elif name in ("dp_shard", "dp_shard_cp"):  # dp_shard_cp: dp_shard x cp flattened (context_parallel.py)
            d = _dp_shard_dim(param, tp_placement)
            stored.append(Replicate() if d is None else Shard(d))
        else:  # tp
            p = tp_placement or Replicate()
            stored.append(p)
            compute.append(p)
            # A replicated weight applied to TP-local activations (QK-norm on local heads)
            # gets a partial gradient on each TP rank: the true gradient is their sum.
            grad.append(tp_placement or (Partial("sum") if tp_partial_grad else Replicate()))
            continue
        compute.append(Replicate())
        grad.append(Partial("avg"))
    return stored, compute, grad


def _shard(param: nn.Parameter, mesh: DeviceMesh, stored: list[Placement]) -> nn.Parameter:
    """This rank's slice of a materialised parameter as a DTensor on `mesh`, without communication."""
    if isinstance(param, DTensor):  # TP already holds this rank's tp slice; cut the dp slice out of it
        dp_names = tuple(n for n in mesh.mesh_dim_names if n != "tp")
        dp_placements = stored[: len(dp_names)]
        local = distribute_tensor(
            param.detach().to_local(), mesh[dp_names], dp_placements, src_data_rank=None
        ).to_local()
    else:
        local = distribute_tensor(param.detach(), mesh, stored, src_data_rank=None).to_local()
    shape, stride = param.shape, param.stride()
    # clone: own storage, so the full tensor is freed once the module lets go of it
    sharded = DTensor.from_local(local.detach().clone(), mesh, stored, run_check=False, shape=shape, stride=stride)
    return nn.Parameter(sharded, requires_grad=param.requires_grad)


def apply_simple_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    mp: MixedPrecision,
    tp_partial_grad: frozenset[str] = frozenset(),
    keep_stored: frozenset[str] = frozenset(),
    skip: frozenset[str] = frozenset(),
) -> nn.Module:
    """Shard every parameter of a materialised model over `mesh` and read it through a Gather.

    `mesh` has dimensions among dp_replicate, dp_shard, tp (see parallel/mesh.py); TP, if
    any, must already be applied. `tp_partial_grad` names parameters whose gradient is a
    partial sum over TP ranks. `keep_stored` names parameters gathered and reduced in their
    stored dtype whatever `mp` says (a model that computes them in fp32 on purpose).
    A parameter shared by several modules is sharded once. `skip` names parameters sharded
    otherwise, left as they are (expert weights on the expert mesh: expert_parallel.py).
    """
    tp_mesh = mesh["tp"] if "tp" in mesh.mesh_dim_names else None
    if mesh.size() == 1 and _world_size() == 1:  # other ranks (pipeline stages) expect the DTensor form
        return _one_process(model, mp, keep_stored, skip)
    done: dict[int, tuple[nn.Parameter, Gather]] = {}
    for mod_name, module in model.named_modules():
        gathers: dict[str, Gather] = {}
        for pname, param in list(module._parameters.items()):
            if param is None or (f"{mod_name}.{pname}" if mod_name else pname) in skip:
                continue
            if id(param) not in done:
                fqn = f"{mod_name}.{pname}" if mod_name else pname
                tp_placement = param.placements[0] if isinstance(param, DTensor) else None
                stored, compute, grad = _placements(param, mesh, tp_placement, fqn in tp_partial_grad)
                sharded = _shard(param, mesh, stored)
                own = MixedPrecision(param.dtype, param.dtype) if fqn in keep_stored else mp
                gather = Gather(compute=compute, grad=grad, mp=own, stored_dtype=param.dtype,
                                tp_mesh=tp_mesh if tp_placement is not None else None, tp_placement=tp_placement)  # fmt: skip
                done[id(param)] = (sharded, gather)
            module._parameters[pname], gathers[pname] = done[id(param)]
        if gathers:
            module.__class__ = _gathered_class(type(module), tuple(sorted(gathers)))
            module._simple_fsdp_gathers = gathers
    return model


def _world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def _one_process(model: nn.Module, mp: MixedPrecision, keep_stored: frozenset[str], skip: frozenset[str]) -> nn.Module:
    """SimpleFSDP of a one-process run: plain parameters, each read through a `Cast` where the policy
    computes in another dtype than the stored one (the gather and the mean-reduce are the identity)."""
    for mod_name, module in model.named_modules():
        reads = {}
        for pname, param in module._parameters.items():
            fqn = f"{mod_name}.{pname}" if mod_name else pname
            if param is not None and fqn not in skip | keep_stored and param.dtype != mp.param_dtype:
                reads[pname] = Cast(mp)
        if reads:
            module.__class__ = _gathered_class(type(module), tuple(sorted(reads)))
            module._simple_fsdp_gathers = reads
    return model


class _AsStored:
    """A read that gathers nothing: the stored DTensor shard itself (`stored_reads`)."""

    def reads(self, stored) -> bool:
        return False


@contextlib.contextmanager
def stored_reads(module: nn.Module):
    """Within it, `module`'s SimpleFSDP parameters (its descendants' too) read as their stored DTensor shards,
    not gathered: a computation on shards whose result stays sharded (the LoRA stream's delta, added to a
    weight's shard before the one gather of the sum). Nothing a backward or a step should see."""
    swapped = {m: m._simple_fsdp_gathers for m in module.modules() if getattr(m, "_simple_fsdp_gathers", None)}
    for m, gathers in swapped.items():
        m._simple_fsdp_gathers = dict.fromkeys(gathers, _AsStored())
    try:
        yield
    finally:
        for m, gathers in swapped.items():
            m._simple_fsdp_gathers = gathers


def stored_parameter(module: nn.Module, name: str) -> nn.Parameter:
    """The stored (sharded, master-dtype) parameter behind `module.<name>`."""
    return module._parameters[name]
