"""The trainer's two hooks into the execution modes, from the config sections."""

from __future__ import annotations

from torch import nn

from titan_core.compile.graph_trainer import GraphTrainStep
from titan_core.compile.per_block import apply_per_block_compile as compile_blocks
from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig


def _check_one_mode(cfg: JobConfig) -> None:
    if cfg.compile.enable and cfg.graph_trainer.enable:
        raise ConfigError(
            "compile.enable and graph_trainer.enable are two execution modes; pick one "
            "(the Graph Trainer compiles the whole step itself with graph_trainer.compile=inductor)"
        )


def apply_per_block_compile(model: nn.Module, cfg: JobConfig) -> list[str]:
    """Compile each block and the loss head per `cfg.compile`; returns their module paths."""
    _check_one_mode(cfg)
    return compile_blocks(model, backend=cfg.compile.backend, fullgraph=cfg.compile.fullgraph)


def graph_train_step(model: nn.Module, optimizer, cfg: JobConfig, *, dp_world: int = 1):
    """A GraphTrainStep for this model and optimizer; the step is captured on its first run.

    dp_world: data-parallel ranks of the run (the loss is normalised over their valid tokens)."""
    _check_one_mode(cfg)
    return GraphTrainStep(
        model,
        optimizer,
        max_norm=cfg.training.max_norm,
        grad_accum=cfg.training.grad_accum,
        dp_world=dp_world,
        config=cfg.graph_trainer,
    )
