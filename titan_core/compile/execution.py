"""The trainer's two hooks into the execution modes, from the config sections; which mode a config
runs in (and the refusal of two at once) is titan_core.config.execution_modes.execution_mode's alone."""

from __future__ import annotations

from torch import nn

from titan_core.compile.graph_trainer import GraphTrainStep
from titan_core.compile.per_block import apply_per_block_compile as compile_blocks
from titan_core.config.sections import JobConfig


def apply_per_block_compile(model: nn.Module, cfg: JobConfig) -> list[str]:
    """Compile each block and the loss head per `cfg.compile`; returns their module paths."""
    return compile_blocks(model, backend=cfg.compile.backend, fullgraph=cfg.compile.fullgraph)


def graph_train_step(model: nn.Module, optimizer, cfg: JobConfig, *, dp_world: int = 1):
    """A GraphTrainStep for this model and optimizer; the step is captured on its first run.

    dp_world: data-parallel ranks of the run (the loss is normalised over their valid tokens)."""
    return GraphTrainStep(
        model,
        optimizer,
        max_norm=cfg.training.max_norm,
        grad_accum=cfg.training.grad_accum,
        dp_world=dp_world,
        config=cfg.graph_trainer,
    )
