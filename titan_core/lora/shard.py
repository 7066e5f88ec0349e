"""[lora] under SimpleFSDP: the adapters sharded like every other parameter, after peft made them.

The trainer parallelises the base on meta, materialises its shards and loads `checkpoint.initial_hf`
by the native names, and only then does peft wrap the (already gathered) Linears: the sharded init
and the HF load never see peft's names or parameters they do not know. peft's new lora_A / lora_B are
then plain tensors, the same on every rank (drawn from the run's seed), and without a reduce their
gradients would be each rank's own: `shard_adapters` hands exactly those to `apply_simple_fsdp`, which
keeps each rank's slice and reads them through the gather whose backward is the gradient's mean.
The frozen base stays as sharded: it is still gathered for the forward, but with requires_grad off its
gather's backward never runs (no reduce-scatter) and the optimizer never sees it. A saved module's
trainable copy is peft's deepcopy of an already sharded module: DTensors with their gathers, left as is.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from titan_core.config.sections import JobConfig
from titan_core.parallel.apply import mixed_precision
from titan_core.parallel.simple_fsdp import apply_simple_fsdp


def shard_adapters(model: nn.Module, cfg: JobConfig, mesh: DeviceMesh) -> list[str]:
    """Shard every parameter peft added over the data-parallel `mesh` (one process: read in the compute
    dtype, as the base is); their names. peft's are the trainable ones no gather reads yet."""
    new, rest = set(), set()
    for mod_name, module in model.named_modules():
        read = getattr(module, "_simple_fsdp_gathers", {})
        for pname, p in module._parameters.items():
            if p is not None:
                fresh = p.requires_grad and pname not in read and not isinstance(p, DTensor)
                (new if fresh else rest).add(f"{mod_name}.{pname}" if mod_name else pname)
    apply_simple_fsdp(model, mesh, mixed_precision(cfg), skip=frozenset(rest))
    return sorted(new)
