"""Parallel degrees -> a named DeviceMesh, and the data-parallel coordinates of this rank.

Mesh dimensions, outer to inner: `dp_replicate` (only when > 1), `dp_shard` (always, so
data parallelism has a dimension even at size 1) and `tp` (only when > 1). Tensor
parallelism is innermost so a TP group holds neighbouring ranks (one host, fast links).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Parallelism


@dataclass(frozen=True)
class Degrees:
    dp_replicate: int
    dp_shard: int
    tp: int

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each sees its own rows of the global batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    @property
    def mode(self) -> str:
        """SimpleFSDP mode these degrees give: replicate, fully_shard or hybrid_shard (HSDP)."""
        if self.dp_replicate > 1 and self.dp_shard > 1:
            return "hybrid_shard"
        if self.dp_replicate > 1:
            return "replicate"
        return "fully_shard"

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, size in (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard), ("tp", self.tp))
            if name == "dp_shard" or size > 1
        )

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in self.dim_names)


def resolve_degrees(p: Parallelism, world_size: int) -> Degrees:
    """Fill the one -1 degree from the world size; any mismatch is a ConfigError with the arithmetic."""
    named = {"dp_replicate": p.dp_replicate, "dp_shard": p.dp_shard, "tp": p.tp}
    for name, value in named.items():
        if value == 0 or value < -1:
            raise ConfigError(f"parallelism.{name} must be >= 1 or -1 (fill), got {value}")
    fill = [name for name, value in named.items() if value == -1]
    if len(fill) > 1:
        raise ConfigError(f"only one parallel degree may be -1 (fill), got {', '.join(fill)}")
    fixed = {name: value for name, value in named.items() if value != -1}
    product = 1
    for value in fixed.values():
        product *= value
    arithmetic = " x ".join(f"{name} ({value})" for name, value in fixed.items()) + f" = {product}"
    if world_size % product:
        raise ConfigError(f"parallelism: {arithmetic} does not divide the world size {world_size}")
    if fill:
        named[fill[0]] = world_size // product
    elif product != world_size:
        raise ConfigError(
            f"parallelism: {arithmetic}, but the world size is {world_size} (set one degree to -1 to fill the rest)"
        )
    return Degrees(**named)


def build_mesh(degrees: Degrees, device_type: str) -> DeviceMesh:
    """The world as a named mesh (needs an initialised default process group)."""
    return init_device_mesh(device_type, degrees.shape, mesh_dim_names=degrees.dim_names)


def dp_dim_names(mesh: DeviceMesh) -> tuple[str, ...]:
    return tuple(n for n in mesh.mesh_dim_names if n.startswith("dp_"))


def dp_coordinates(mesh: DeviceMesh) -> tuple[int, int]:
    """(dp rank, dp world) of this process: which rows of the global batch it reads."""
    rank, world = 0, 1
    for name in dp_dim_names(mesh):
        size = mesh.size(mesh.mesh_dim_names.index(name))
        rank = rank * size + mesh.get_local_rank(name)
        world *= size
    return rank, world


def dp_group(mesh: DeviceMesh):
    """The process group of this rank's data-parallel peers (the ranks holding other rows of the
    global batch); None when there are none. Tensor-parallel peers are not in it: they hold the
    same rows. Two data-parallel dimensions of size > 1 (HSDP) are flattened into one group."""
    names = [n for n in dp_dim_names(mesh) if mesh.size(mesh.mesh_dim_names.index(n)) > 1]
    if not names:
        return None
    if len(names) == 1:
        return mesh.get_group(names[0])
    return mesh[tuple(names)]._flatten().get_group()
