"""Expert parallelism (parallelism.ep > 1): MoE experts split over ranks, tokens sent to them.

Where the experts are: every `Experts` kernel of the model (titan_core/models/common/moe.py and
each kernel that swaps it, at `layers.*.moe.experts`), which holds its weights w1/w3/w2 [E, ...]
(native families and ports), or is handed them by its parent (the transformers path:
transformers' experts module keeps gate_up_proj / down_proj [E, ...] and computes through its
`kernel` child, titan_core/models/transformers/experts.py). Either way dim 0 is the expert.

How the weights are held: on the expert mesh (parallel/mesh.py `build_expert_mesh`: the same
ranks with dp_shard x cp regrouped as (edp, ep)), each expert weight is stored `Shard(0)` over
`ep` (rank p of an ep group keeps experts p * E/ep .. (p + 1) * E/ep - 1, whole), `Shard(1)`
over `edp` and `Replicate` over `dp_replicate`, and read through SimpleFSDP's gathering property:
the read all-gathers over edp (and dp_replicate) and stays split over ep, so a module sees its
E/ep local experts. Every other parameter keeps SimpleFSDP over the world mesh.

Gradient scale: a rank's expert gradient, after the dispatch's backward, already sums the
contributions of every rank of its ep group (their rows were computed here). SimpleFSDP takes
the data-parallel mean of each rank's loss term's gradient (`Partial("avg")` over every
data-parallel rank: dp_replicate x dp_shard x cp = dp_replicate x edp x ep). `Partial("avg")`
over edp and dp_replicate averages the ep groups' sums, so one more factor 1/ep makes the
expert gradient that same mean, exactly the ep = 1 run's.

What is refused (ConfigError, exit 2): a model with no `Experts` kernel (a dense model, or a
transformers model whose experts stay transformers' own: the reason is theirs), layers with
different numbers of experts, and n_experts not divisible by ep.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Placement, Replicate, Shard

from titan_core.config.loader import ConfigError
from titan_core.config.execution_modes import execution_mode
from titan_core.config.sections import JobConfig
from titan_core.models.common.moe import Experts
from titan_core.models.common.protocol import TrainableModel
from titan_core.models.transformers.experts import KERNEL_CHILD
from titan_core.parallel.expert_dispatch import ExpertDispatch
from titan_core.parallel.mesh import Degrees
from titan_core.parallel.simple_fsdp import Gather, MixedPrecision, _gathered_class, _shard

EXPERTS_PATTERN = "layers.*.moe.experts"
"""The native swap path of the experts (a model's `swap_refusals` says why its own cannot be used)."""
EXPERT_DIMS = ("dp_replicate", "edp", "ep")
"""The expert mesh's dimensions the expert weights live on, those of more than one rank and always ep
(pp ranks hold other layers; tp peers hold the same experts, the MoE layers running whole on each)."""


def check_expert_parallel(cfg: JobConfig, degrees: Degrees) -> None:
    """The checks of ep that need no model and no process group (ConfigError, one line each)."""
    p, ep = cfg.parallelism, degrees.ep
    if ep == 1:
        if p.ep_capacity_factor > 0:
            raise ConfigError(
                f"parallelism.ep_capacity_factor = {p.ep_capacity_factor} drops rows at the expert-parallel "
                "dispatch, which only ep > 1 has; set it to 0 or ep > 1"
            )
        return
    if p.data_parallel != "simple_fsdp":
        raise ConfigError(
            f"parallelism.ep = {ep} composes with data_parallel = 'simple_fsdp' only, not '{p.data_parallel}'"
        )
    if execution_mode(cfg) == "graph_trainer":
        raise ConfigError(
            f"parallelism.ep = {ep}: the dispatch reads its all-to-all sizes on the host in every MoE layer, "
            "which one captured program cannot hold; set graph_trainer.enable = false"
        )


@dataclass(frozen=True)
class ExpertSite:
    """One MoE layer's experts: the kernel that computes them and the module that holds their weights."""

    path: str
    kernel: Experts
    owner: nn.Module
    """The kernel itself when it holds w1/w3/w2, else its parent (transformers' experts module)."""
    owner_path: str
    names: tuple[str, ...]
    """The owner's expert weights, each [n_experts, ...]."""
    n_experts: int


def _site(model: nn.Module, path: str, kernel: Experts) -> ExpertSite:
    if kernel.w1 is not None:
        return ExpertSite(path, kernel, kernel, path, ("w1", "w3", "w2"), kernel.w1.shape[0])
    owner_path = path.rpartition(".")[0]
    owner = model.get_submodule(owner_path)
    names = tuple(owner._parameters)
    if path.rpartition(".")[2] != KERNEL_CHILD or not names or len({owner._parameters[n].shape[0] for n in names}) != 1:
        raise ConfigError(
            f"parallelism.ep > 1: the experts kernel at {path} holds no weights and its parent does not hold "
            "them as [n_experts, ...] tensors, so they cannot be split over ranks; set ep = 1"
        )
    return ExpertSite(path, kernel, owner, owner_path, names, owner._parameters[names[0]].shape[0])


def expert_sites(model: nn.Module) -> list[ExpertSite]:
    """Every experts kernel of `model` with where its weights are (see the module docstring)."""
    return [_site(model, path, m) for path, m in model.named_modules() if isinstance(m, Experts)]


def check_expert_model(model: TrainableModel, ep: int) -> list[ExpertSite]:
    """The model's expert sites, or a ConfigError (one line) saying why it cannot take `ep`."""
    sites = expert_sites(model)
    if not sites:
        why = model.swap_refusals.get(EXPERTS_PATTERN)
        if why:
            raise ConfigError(
                f"parallelism.ep = {ep}: this model's experts stay transformers' own ({why}), "
                "so they cannot be split over ranks; set ep = 1"
            )
        raise ConfigError(
            f"parallelism.ep = {ep} splits MoE experts over ranks, but this model has no experts of titan_core's "
            "Experts kind (a dense model, or a port whose experts are a class of its own); set ep = 1"
        )
    counts = sorted({s.n_experts for s in sites})
    if len(counts) > 1:
        raise ConfigError(
            f"parallelism.ep = {ep}: the MoE layers have different numbers of experts {counts}; set ep = 1"
        )
    if counts[0] % ep:
        raise ConfigError(
            f"parallelism.ep = {ep} must divide the model's n_experts = {counts[0]} "
            "(each ep rank holds n_experts / ep whole experts)"
        )
    return sites


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times `scale` (the expert gradient's 1/ep, see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class ExpertGather(Gather):
    """SimpleFSDP's read of an expert weight: gathered over edp / dp_replicate, left split over ep."""

    def __init__(self, *, ep: int, **kwargs):
        super().__init__(**kwargs)
        self.grad_scale = 1.0 / ep

    def __call__(self, stored):
        return _ScaleGrad.apply(super().__call__(stored), self.grad_scale)


def _expert_placements(mesh: DeviceMesh) -> tuple[list[Placement], list[Placement], list[Placement]]:
    """(stored, compute, grad) placements of an expert weight [E, ...] on the expert mesh `mesh`."""
    stored, compute, grad = [], [], []
    for name in mesh.mesh_dim_names:
        if name == "ep":
            stored.append(Shard(0))
            compute.append(Shard(0))
            grad.append(Shard(0))
        else:  # edp shards a weight's second dim (the first is ep's); dp_replicate keeps a copy
            stored.append(Shard(1) if name == "edp" else Replicate())
            compute.append(Replicate())
            grad.append(Partial("avg"))
    return stored, compute, grad


class _ExpertParallelKernel:
    """Mixed in before an experts kernel's class: its forward through the ep dispatch."""

    def forward(self, x, weights, experts, expert_weights=None):
        local = self.expert_weights(expert_weights)  # this rank's E/ep experts: each weight read (gathered) once
        kernel = super()

        def run_local(rows: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
            # one row per (token, expert) pair, weight 1: the router weights are applied after the return trip
            return kernel.forward(rows, rows.new_ones(rows.shape[0], 1), local_ids[:, None], local)

        return self._ep_dispatch(x, weights, experts, run_local)


_EP_CLASSES: dict[type, type] = {}


def _ep_class(cls: type) -> type:
    if cls not in _EP_CLASSES:
        _EP_CLASSES[cls] = type(f"ExpertParallel{cls.__name__}", (_ExpertParallelKernel, cls), {})
    return _EP_CLASSES[cls]


def apply_expert_parallel(
    model: nn.Module,
    expert_mesh: DeviceMesh,
    mp: MixedPrecision,
    keep_stored: frozenset[str] = frozenset(),
    capacity_factor: float = 0.0,
) -> frozenset[str]:
    """Shard the expert weights of a materialised model over `expert_mesh` and route its tokens
    through the ep dispatch; returns the expert weights' names, which SimpleFSDP must leave alone.

    `keep_stored` names weights gathered and reduced in their stored dtype (as in apply_simple_fsdp).
    """
    ep = expert_mesh.size(expert_mesh.mesh_dim_names.index("ep"))
    sites = check_expert_model(model, ep)
    # a dimension of one rank would only add collectives over one rank (a norm's all-reduce among them)
    sizes = dict(zip(expert_mesh.mesh_dim_names, expert_mesh.shape))
    mesh = expert_mesh[tuple(n for n in sizes if n in EXPERT_DIMS and (n == "ep" or sizes[n] > 1))]
    stored, compute, grad = _expert_placements(mesh)
    dispatch = ExpertDispatch(expert_mesh.get_group("ep"), sites[0].n_experts, capacity_factor)
    names: set[str] = set()
    for site in sites:
        gathers = {}
        for name in site.names:
            param = site.owner._parameters[name]
            fqn = f"{site.owner_path}.{name}" if site.owner_path else name
            own = MixedPrecision(param.dtype, param.dtype) if fqn in keep_stored else mp
            site.owner._parameters[name] = _shard(param, mesh, stored)
            gathers[name] = ExpertGather(ep=ep, compute=compute, grad=grad, mp=own, stored_dtype=param.dtype)
            names.add(fqn)
        site.owner.__class__ = _gathered_class(type(site.owner), tuple(sorted(gathers)))
        site.owner._simple_fsdp_gathers = gathers
        # after the owner's class: natively the kernel is the owner, and its class now reads the gathers
        site.kernel.__class__ = _ep_class(type(site.kernel))
        site.kernel._ep_dispatch = dispatch
    return frozenset(names)


def expert_dispatch(model: nn.Module) -> ExpertDispatch | None:
    """The model's ep dispatch (None when expert parallelism is not applied)."""
    return next((m._ep_dispatch for m in model.modules() if isinstance(m, _ExpertParallelKernel)), None)


def dropped_rows(dispatch: ExpertDispatch, device: torch.device) -> int:
    """(token, expert) rows dropped since the last call, summed over every rank (a collective:
    every rank calls it at the same step). Each rank counts the rows it sent, so the sum counts
    each dropped row once. A host read, as every dispatch already makes one per MoE layer."""
    n = torch.tensor([dispatch.take_dropped()], dtype=torch.int64, device=device)
    if dispatch.capacity_factor > 0:  # nothing can be dropped otherwise: no collective for a known 0
        dist.all_reduce(n)
    return int(n.item())
