"""Parallel degrees -> a named DeviceMesh, and the data-parallel coordinates of this rank.

Mesh dimensions, outer to inner: `pp`, `dp_replicate`, `dp_shard` (always, so data
parallelism has a dimension even at size 1), `cp` and `tp`; each but dp_shard only when
> 1. Tensor parallelism is innermost so a TP group holds neighbouring ranks (one host,
fast links). Expert parallelism adds no factor: it regroups dp_shard x cp (the borrowing
rule) into a second mesh over the same ranks, `build_expert_mesh`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Parallelism


@dataclass(frozen=True)
class Degrees:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int = 1
    cp: int = 1
    ep: int = 1
    """Expert-parallel ranks, carved from dp_shard x cp (not an extra factor of the world size)."""

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each sees its own rows of the global batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

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
        return tuple(name for name, size in self._dims() if name == "dp_shard" or size > 1)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in self.dim_names)

    @property
    def expert_dims(self) -> tuple[tuple[str, int], ...]:
        """The same ranks as the world mesh, with dp_shard x cp regrouped as (edp, ep): experts are
        split over `ep` and their shards over `edp`; () when ep == 1."""
        if self.ep == 1:
            return ()
        dims = (("pp", self.pp), ("dp_replicate", self.dp_replicate),
                ("edp", self.dp_shard * self.cp // self.ep), ("ep", self.ep), ("tp", self.tp))  # fmt: skip
        return tuple((n, s) for n, s in dims if n in ("edp", "ep") or s > 1)

    def _dims(self) -> tuple[tuple[str, int], ...]:
        # outer to inner; TP innermost (one host), CP next to it (sequence chunks exchange KV every layer)
        return (("pp", self.pp), ("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard),
                ("cp", self.cp), ("tp", self.tp))  # fmt: skip


def resolve_degrees(p: Parallelism, world_size: int) -> Degrees:
    """Fill the one -1 degree from the world size; any mismatch is a ConfigError with the arithmetic."""
    named = {"pp": p.pp, "dp_replicate": p.dp_replicate, "dp_shard": p.dp_shard, "cp": p.cp, "tp": p.tp}
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
    # pp and cp are named only when set: most runs use neither, and the line should read as before them
    shown = {n: v for n, v in fixed.items() if n not in ("pp", "cp") or v != 1}
    arithmetic = " x ".join(f"{name} ({value})" for name, value in shown.items()) + f" = {product}"
    if world_size % product:
        raise ConfigError(f"parallelism: {arithmetic} does not divide the world size {world_size}")
    if fill:
        named[fill[0]] = world_size // product
    elif product != world_size:
        raise ConfigError(
            f"parallelism: {arithmetic}, but the world size is {world_size} (set one degree to -1 to fill the rest)"
        )
    degrees = Degrees(**named, ep=p.ep)
    if (degrees.dp_shard * degrees.cp) % degrees.ep:
        raise ConfigError(
            f"parallelism.ep = {degrees.ep} must divide dp_shard x cp = {degrees.dp_shard} x {degrees.cp} "
            "(expert-parallel ranks are carved from them)"
        )
    return degrees


def smallest_world(p: Parallelism) -> int:
    """The fewest processes these degrees resolve on: a -1 degree at its smallest (dp_shard: the
    least that lets ep divide dp_shard x cp; any other: 1). For checks made without a world."""
    fixed = [max(v, 1) for v in (p.pp, p.dp_replicate, p.cp, p.tp)]
    shard = p.dp_shard if p.dp_shard > 0 else next(k for k in range(1, p.ep + 1) if (k * p.cp) % p.ep == 0)
    return shard * math.prod(fixed)


def build_mesh(degrees: Degrees, device_type: str) -> DeviceMesh:
    """The world as a named mesh (needs an initialised default process group)."""
    return init_device_mesh(device_type, degrees.shape, mesh_dim_names=degrees.dim_names)


def build_expert_mesh(degrees: Degrees, device_type: str) -> DeviceMesh | None:
    """The world regrouped for experts (see Degrees.expert_dims); None when ep == 1."""
    if degrees.ep == 1:
        return None
    names, shape = zip(*degrees.expert_dims)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


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
