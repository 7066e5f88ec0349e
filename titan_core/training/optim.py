"""AdamW with no-decay groups (one pair per block), and the warmup + decay learning-rate schedule."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from titan_core.config.sections import LRScheduler as LRConfig
from titan_core.config.sections import Optimizer as OptConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: biases, norm gains and embeddings keep their scale."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        exempt = p.ndim < 2 or "embeddings" in name or name.rpartition(".")[0].endswith("norm")
        (no_decay if exempt else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


_BLOCK = re.compile(r"^(.*?\.\d+)\.")
"""A parameter's block: the first numbered container in its name ("layers.3", "model.layers.3")."""


def per_block(model: nn.Module, groups: list[dict]) -> list[dict]:
    """Each group cut into one group per block (parameters outside any block: one group), in order.

    The foreach AdamW step makes whole-group temporaries (the denominators: one tensor per parameter of
    the group), so one group for the model holds a second copy of every shard a rank owns at the step's
    peak; a group per block holds one block's. Each element's arithmetic is the same either way."""
    block_of = {id(p): (m.group(1) if (m := _BLOCK.match(n)) else "") for n, p in model.named_parameters()}
    out = []
    for g in groups:
        runs: dict[str, list] = {}
        for p in g["params"]:
            runs.setdefault(block_of[id(p)], []).append(p)
        out += [{**g, "params": ps} for ps in runs.values()]
    return out


def build_optimizer(model: nn.Module, cfg: OptConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        per_block(model, param_groups(model, cfg.weight_decay)), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps, foreach=True,
    )


def lr_factor(step: int, cfg: LRConfig, total_steps: int) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.decay == "none":
        return 1.0
    span = max(total_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    if cfg.decay == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_lr_scheduler(optimizer: torch.optim.Optimizer, cfg: LRConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))
