"""Parameters as the captured step sees them: local shards in, the model's DTensors rebuilt inside.

Graph inputs are always local shards (`local_tensor`); `ParamSpec` records how a sharded
parameter is rebuilt from its shard, and `as_param` rebuilds it where the model reads it.
capture.py, scan.py and functional_optim.py all use these.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from titan_core.parallel.local import local_tensor

__all__ = ["ParamSpec", "as_param", "local_tensor", "param_spec"]


@dataclass(frozen=True)
class ParamSpec:
    """How a sharded parameter is rebuilt from its local shard inside the step."""

    mesh: object
    placements: tuple
    shape: torch.Size
    stride: tuple


def param_spec(p: torch.Tensor) -> ParamSpec | None:
    """None for a plain tensor, or the ParamSpec of a sharded (DTensor) one."""
    return ParamSpec(p.device_mesh, tuple(p.placements), p.shape, p.stride()) if isinstance(p, DTensor) else None


def as_param(local: torch.Tensor, spec: ParamSpec | None) -> torch.Tensor:
    """The value the model reads: the local shard itself, or the DTensor it is a shard of.

    Graph inputs are always local shards: a DTensor input would be baked into the graph
    as a constant (real mode) or refused (fake mode); wrapping here keeps the shard an
    input while the model's SimpleFSDP gather traces into all-gather / reduce-scatter nodes.
    """
    if spec is None:
        return local
    return DTensor.from_local(local, spec.mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride)
