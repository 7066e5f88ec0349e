"""AdamW with no-decay groups, and the warmup + decay learning-rate schedule."""

from __future__ import annotations

import math

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


def build_optimizer(model: nn.Module, cfg: OptConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True
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
