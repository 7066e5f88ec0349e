"""Activation checkpointing (`[activation_checkpoint]`): a block's activations recomputed in the backward.

Applied from outside the model, like the parallelisms, after them and before per-block compile:
each decoder block of `model.layers` whose turn it is gets a class of its own whose `forward`
runs the block's own forward under `torch.utils.checkpoint.checkpoint` (non-reentrant). A class
swap rather than a wrapper module, so parameter names, state dicts and DCP checkpoints are the
same with and without it. Everything a block reads inside (SimpleFSDP's gathers, FSDP2's unsharded
parameters, the ep dispatch, cp's K/V gather) runs inside the checkpointed region.

- full: a block keeps only its inputs; its forward runs again in the backward (SimpleFSDP's
  gathers included, so gathered weights are not kept either).
- selective op: a block keeps what is costly to recompute (SAVED_OPS: matmuls, attention and
  collectives) and recomputes everything else (norms, activations, RoPE, casts) from those.
- selective layer: one block in every `layer_period` is checkpointed whole, the others not.

Numerics do not change: the recompute runs the same ops on the same inputs (fp32: bit-identical
losses and gradients; tests/core/unit/test_activation_checkpoint.py). Refused (ConfigError, exit
2): with the Graph Trainer (its `memory_policy` decides what the captured step keeps), and on a
model with no blocks to wrap.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from titan_core.config.loader import ConfigError
from titan_core.config.execution_modes import execution_mode
from titan_core.config.sections import JobConfig

aten = torch.ops.aten
_c10d = torch.ops._c10d_functional

SAVED_OPS = frozenset(
    {
        aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten._grouped_mm.default,
        aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default, aten._scaled_dot_product_cudnn_attention.default,
        _c10d.all_gather_into_tensor.default, _c10d.reduce_scatter_tensor.default, _c10d.all_reduce.default,
        _c10d.all_to_all_single.default, _c10d.wait_tensor.default,
    }
)  # fmt: skip
"""What selective op keeps: the work that is costly to redo (matmuls, attention) and every collective (a
recompute never communicates again)."""


def check_activation_checkpoint(cfg: JobConfig) -> None:
    """The refusals that need no model (ConfigError, one line)."""
    ac = cfg.activation_checkpoint
    if ac.mode != "none" and execution_mode(cfg) == "graph_trainer":
        raise ConfigError(
            f"activation_checkpoint.mode = {ac.mode} with the Graph Trainer: the captured step decides what it keeps "
            "by graph_trainer.memory_policy (default, full, offload); set activation_checkpoint.mode = none"
        )


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_policy)


class _Checkpointed:
    """Mixed in before a block's class: its forward, checkpointed."""

    def forward(self, *args, **kwargs):
        if self._ac_context is None:  # full (torch.compile takes no context_fn that makes no modes)
            return checkpoint(super().forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(super().forward, *args, use_reentrant=False, context_fn=self._ac_context, **kwargs)


_CLASSES: dict[type, type] = {}


def _checkpointed_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Checkpointed{cls.__name__}", (_Checkpointed, cls), {})
    return _CLASSES[cls]


def apply_activation_checkpoint(model: nn.Module, cfg: JobConfig) -> list[str]:
    """Checkpoint the blocks `cfg.activation_checkpoint` names (in place); returns their module paths."""
    check_activation_checkpoint(cfg)
    ac = cfg.activation_checkpoint
    if ac.mode == "none":
        return []
    blocks = list(model.layers.items())
    if not blocks:
        raise ConfigError(
            f"activation_checkpoint.mode = {ac.mode}: this model has no decoder blocks (model.layers is empty) to "
            "checkpoint; set activation_checkpoint.mode = none"
        )
    every = ac.layer_period if ac.mode == "selective" and ac.selective == "layer" else 1
    context = _selective_context if ac.mode == "selective" and ac.selective == "op" else None
    wrapped = []
    for i, (name, block) in enumerate(blocks):
        if i % every:
            continue
        block.__class__ = _checkpointed_class(type(block))
        block._ac_context = context
        wrapped.append(f"layers.{name}")
    return wrapped


def in_recompute() -> bool:
    """Whether the forward running now is a checkpoint's recompute (it runs inside a backward): code with a
    host-side effect per forward (a counter) skips it there, so it counts once."""
    return torch._C._current_graph_task_id() != -1
