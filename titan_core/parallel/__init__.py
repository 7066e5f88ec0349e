"""Parallelism applied from outside the model: mesh, tensor parallel, SimpleFSDP, FSDP2.

degrees = check_parallelism(cfg, world_size)   # ConfigError (exit 2) on bad degrees
mesh = build_mesh(degrees, device.type)          # needs the process group (titan_core.runtime.distributed)
parallelize(model, cfg, mesh)                    # on meta (apply.py), before the sharded init and the optimizer
"""

from __future__ import annotations

from titan_core.config.loader import ConfigError
from titan_core.config.execution_modes import execution_mode
from titan_core.config.sections import JobConfig
from titan_core.parallel.apply import mixed_precision, parallelize
from titan_core.parallel.context_parallel import check_context_parallel
from titan_core.parallel.expert_parallel import check_expert_parallel
from titan_core.parallel.grads import clip_grad_norm_
from titan_core.parallel.local import local_tensor
from titan_core.parallel.mesh import Degrees, build_mesh, dp_coordinates, resolve_degrees
from titan_core.parallel.pipeline import check_pipeline
from titan_core.parallel.regather import check_regather
from titan_core.parallel.simple_fsdp import MixedPrecision, stored_parameter
from titan_core.parallel.tensor_parallel import plan_for

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
    execution_mode(cfg)  # two modes at once is refused before any check that reads one of them
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
