"""Parallelism applied from outside the model: mesh, tensor parallel, SimpleFSDP, FSDP2.

degrees = check_parallelism(cfg, world_size)   # ConfigError (exit 2) on bad degrees
mesh = build_mesh(degrees, device.type)          # needs the process group (titan_core.runtime.distributed)
parallelize(model, cfg, mesh)                    # after init_weights, before the optimizer
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

from titan_core.config.dtypes import DTYPES
from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.models.common.protocol import TrainableModel
from titan_core.parallel.context_parallel import apply_context_parallel, check_context_parallel, fsdp_mesh
from titan_core.parallel.expert_parallel import apply_expert_parallel, check_expert_parallel
from titan_core.parallel.fsdp2 import apply_fsdp2
from titan_core.parallel.grads import clip_grad_norm_
from titan_core.parallel.local import local_tensor
from titan_core.parallel.mesh import Degrees, build_mesh, dp_coordinates, dp_dim_names, resolve_degrees
from titan_core.parallel.pipeline import check_pipeline
from titan_core.parallel.regather import check_regather
from titan_core.parallel.simple_fsdp import MixedPrecision, apply_simple_fsdp, stored_parameter
from titan_core.parallel.tensor_parallel import apply_tensor_parallel, plan_for

__all__ = [
    "Degrees",
    "MixedPrecision",
    "build_mesh",
    "check_parallelism",
    "clip_grad_norm_",
    "dp_coordinates",
    "local_tensor",
    "mixed_precision",
    "parallelize",
    "plan_for",
    "resolve_degrees",
    "stored_parameter",
]


def check_parallelism(cfg: JobConfig, world_size: int) -> Degrees:
    """Every check that needs no process group: degrees vs world size, mode combinations, TP plan."""
    mode = cfg.parallelism.data_parallel
    degrees = resolve_degrees(cfg.parallelism, world_size)
    check_context_parallel(cfg, degrees)
    check_expert_parallel(cfg, degrees)
    check_pipeline(cfg, degrees)
    check_regather(cfg)
    if mode == "none":
        if world_size > 1:
            raise ConfigError(
                f"WORLD_SIZE={world_size} but parallelism.data_parallel = 'none': "
                "choose simple_fsdp or fsdp2 to run on several processes"
            )
        return degrees
    if degrees.tp > 1:
        if mode != "simple_fsdp":
            raise ConfigError(
                f"parallelism.tp = {degrees.tp} composes with data_parallel = 'simple_fsdp' only, not '{mode}'"
            )
        if cfg.model.module_file:
            raise ConfigError("parallelism.tp > 1 is not available for a ported model (model.module_file)")
        plan = plan_for(cfg.model.family)
        if cfg.parallelism.sequence_parallel and plan.no_sequence_parallel:
            raise ConfigError(
                f"parallelism.sequence_parallel with family '{cfg.model.family}': {plan.no_sequence_parallel}; "
                "set sequence_parallel = false"
            )
    if cfg.parallelism.sequence_parallel:
        if degrees.tp == 1:
            raise ConfigError("parallelism.sequence_parallel splits the sequence over TP ranks: it needs tp > 1")
        if cfg.training.seq_len % degrees.tp:
            raise ConfigError(
                f"sequence parallel: tp ({degrees.tp}) does not divide training.seq_len ({cfg.training.seq_len})"
            )
    return degrees


def mixed_precision(cfg: JobConfig) -> MixedPrecision:
    return MixedPrecision(
        param_dtype=DTYPES[cfg.training.mixed_precision_param],
        reduce_dtype=DTYPES[cfg.training.mixed_precision_reduce],
    )


def parallelize(
    model: TrainableModel, cfg: JobConfig, mesh: DeviceMesh, expert_mesh: DeviceMesh | None = None
) -> TrainableModel:
    """Apply TP (if the mesh has a `tp` dimension), then the configured data parallelism, in place;
    with an `expert_mesh` (ep > 1, mesh.build_expert_mesh) the experts go on it first.

    The model must be materialised and initialised (see simple_fsdp.py for why).
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
        apply_simple_fsdp(model, mesh, mp, partial, kept, skip=experts)
    elif mode == "fsdp2":
        apply_fsdp2(model, mesh[dp_dim_names(mesh)], mp, kept)
    else:
        raise ConfigError(f"parallelize: data_parallel '{mode}' has nothing to apply")
    model.buffers_follow(mp.param_dtype)
    return model
