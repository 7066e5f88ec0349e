"""[lora] on several ranks: the adapters sharded like every other parameter, after peft made them.

The trainer parallelises the base on meta, materialises its shards and loads `checkpoint.initial_hf`
by the native names, and only then does peft wrap the (already gathered) Linears: the sharded init
and the HF load never see peft's names or parameters they do not know. peft's new lora_A / lora_B are
then plain tensors, the same on every rank (drawn from the run's seed), and without a reduce their
gradients would be each rank's own: `shard_adapters` hands exactly those to `apply_simple_fsdp`, which
keeps each rank's slice and reads them through the gather whose backward is the gradient's mean. Under
tp they are DTensors on the tp mesh by then (split or replicated there: tensor_parallel.py), which
SimpleFSDP shards over dp as it does TP's own parameters.
The frozen base stays as sharded: it is still gathered for the forward, but with requires_grad off its
gather's backward never runs (no reduce-scatter) and the optimizer never sees it. A saved module's
trainable copy is peft's deepcopy of an already sharded module: DTensors with their gathers, left as is.

Under FSDP2 (`shard_adapters_fsdp2`) each block's adapters become one more FSDP2 unit of their own
(`fully_shard` over the list of that block's lora_A / lora_B Linears): gathered when the first of them
runs, their gradients reduce-scattered, while the base stays in the block's unit, whose reduce skips
what does not train. The units are added before the first forward, where FSDP2's lazy init finds them.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.parallel.apply import mixed_precision
from titan_core.parallel.fsdp2 import fsdp2_policy
from titan_core.parallel.mesh import dp_dim_names
from titan_core.parallel.simple_fsdp import apply_simple_fsdp


def shard_adapters(model: nn.Module, cfg: JobConfig, mesh: DeviceMesh) -> list[str]:
    """Shard every parameter peft added over the data-parallel `mesh` as the recipe's data_parallel
    shards the base (one process: read in the compute dtype, as the base is); their names."""
    if cfg.parallelism.data_parallel == "fsdp2":
        return shard_adapters_fsdp2(model, cfg, mesh)
    return _shard_simple_fsdp(model, cfg, mesh)


def _shard_simple_fsdp(model: nn.Module, cfg: JobConfig, mesh: DeviceMesh) -> list[str]:
    """peft's parameters are the trainable ones no gather reads yet."""
    new, rest = set(), set()
    for mod_name, module in model.named_modules():
        read = getattr(module, "_simple_fsdp_gathers", {})
        for pname, p in module._parameters.items():
            if p is not None:
                # a DTensor on the tp mesh alone is an adapter split over tp (tensor_parallel.py), still fresh
                tp_only = isinstance(p, DTensor) and p.device_mesh.mesh_dim_names == ("tp",)
                fresh = p.requires_grad and pname not in read and (tp_only or not isinstance(p, DTensor))
                (new if fresh else rest).add(f"{mod_name}.{pname}" if mod_name else pname)
    apply_simple_fsdp(model, mesh, mixed_precision(cfg), skip=frozenset(rest))
    return sorted(new)


def shard_adapters_fsdp2(model: nn.Module, cfg: JobConfig, mesh: DeviceMesh) -> list[str]:
    """One FSDP2 unit per FSDP2 unit of the base holding adapters: that unit's lora_A / lora_B Linears."""
    from peft.tuners.lora import LoraLayer  # lazy: the [hf] extra
    from torch.distributed.fsdp import FSDPModule, fully_shard

    units: dict[str, list[nn.Module]] = {}
    names: list[str] = []
    modules = dict(model.named_modules())
    for name, layer in modules.items():
        if not isinstance(layer, LoraLayer):
            continue
        if layer.lora_embedding_A:  # read as parameters, never called: no forward for FSDP2 to gather them on
            raise ConfigError(f"lora: data_parallel = \"fsdp2\" cannot shard the adapter of embedding {name}; "
                              "use data_parallel = \"simple_fsdp\" or leave it out of lora.target_modules")  # fmt: skip
        parts = name.split(".")
        owner = next(p for p in (".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1))
                     if isinstance(modules[p], FSDPModule))  # fmt: skip
        adapters = [*layer.lora_A.values(), *layer.lora_B.values()]
        units.setdefault(owner, []).extend(adapters)
        names += [f"{name}.{kind}.{key}.{p}" for kind in ("lora_A", "lora_B")
                  for key, m in getattr(layer, kind).items() for p, _ in m.named_parameters()]  # fmt: skip
    policy = fsdp2_policy(model, mixed_precision(cfg))
    for adapters in units.values():
        fully_shard(adapters, mesh=mesh[dp_dim_names(mesh)], mp_policy=policy)
    return sorted(names)
