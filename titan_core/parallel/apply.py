"""The parallelisms applied to a model on meta, in their one order: tensor parallel, context parallel,
expert parallel, then the data-parallel kind (the whole model's `parallelize`, and each pipeline stage's)."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

from titan_core.config.dtypes import DTYPES
from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.models.common.protocol import TrainableModel
from titan_core.parallel.context_parallel import apply_context_parallel, fsdp_mesh
from titan_core.parallel.expert_parallel import apply_expert_parallel
from titan_core.parallel.fsdp2 import apply_fsdp2
from titan_core.parallel.mesh import dp_dim_names
from titan_core.parallel.simple_fsdp import MixedPrecision, apply_simple_fsdp
from titan_core.parallel.tensor_parallel import apply_tensor_parallel


def mixed_precision(cfg: JobConfig) -> MixedPrecision:
    return MixedPrecision(
        param_dtype=DTYPES[cfg.training.mixed_precision_param],
        reduce_dtype=DTYPES[cfg.training.mixed_precision_reduce],
    )


def parallelize(
    model: TrainableModel, cfg: JobConfig, mesh: DeviceMesh, expert_mesh: DeviceMesh | None = None,
    skip: frozenset[str] = frozenset(),
) -> TrainableModel:
    """Apply TP (if the mesh has a `tp` dimension), then the configured data parallelism, in place;
    with an `expert_mesh` (ep > 1, mesh.build_expert_mesh) the experts go on it first. `skip`: parameters
    SimpleFSDP leaves alone (a pipeline stage's parameters of other stages, drawn and dropped).

    On meta (the sharded init then makes the shards real: sharded_init.py).
    """
    mode = cfg.parallelism.data_parallel
    partial: frozenset[str] = frozenset()
    if "tp" in mesh.mesh_dim_names:
        partial = apply_tensor_parallel(
            model, cfg.model.family, mesh["tp"], sequence_parallel=cfg.parallelism.sequence_parallel
        )
    if "cp" in mesh.mesh_dim_names:
        # attention gathers K/V over cp; parameters shard and average over dp_shard x cp flattened
        apply_context_parallel(model, mesh["cp"])
        mesh = fsdp_mesh(mesh)
    mp = mixed_precision(cfg)
    # a model that keeps some parameters in fp32 and some buffers in the compute dtype on purpose,
    # as its own code expects (the transformers path: transformers' model of that dtype), gets them so
    kept = model.params_kept_fp32(mp.param_dtype)
    if mode == "simple_fsdp":
        experts = frozenset()
        if expert_mesh is not None:
            experts = apply_expert_parallel(model, expert_mesh, mp, kept, cfg.parallelism.ep_capacity_factor)
        apply_simple_fsdp(model, mesh, mp, partial, kept, skip=skip | experts)
    elif mode == "fsdp2":
        apply_fsdp2(model, mesh[dp_dim_names(mesh)], mp, kept)
    else:
        raise ConfigError(f"parallelize: data_parallel '{mode}' has nothing to apply")
    model.buffers_follow(mp.param_dtype)
    return model
