"""Kernels, each a swap: one flag, comparable with the plain path it replaces.

    kernels.loss      = plain | fused_ce                        (module `loss_head`)
    kernels.attention = sdpa | naive | tokamax | splash | flex  (modules `layers.*.attention.core`)
    kernels.moe       = loop | dense | grouped_mm | tokamax     (modules `layers.*.moe.experts`)
    kernels.float8    = none | tensorwise | rowwise             (the eligible nn.Linear modules, torchao)

`swaps_for(cfg.kernels)` turns the section into swap names for `apply_swaps`. Settings
(ce_chunk, z_loss) are part of the swap name, e.g. `loss.fused_ce(chunk=512,z_loss=0.0001)`,
so the swap log says exactly what was applied. Nothing here imports jax: the tokamax and
splash modules import it when they first run.
"""

from __future__ import annotations

from titan_core.kernels.attention import KernelRefusesModel, KernelUnavailable
from titan_core.kernels.swaps import DEFAULTS, swaps_for

__all__ = [
    "DEFAULTS",
    "KernelRefusesModel",
    "KernelUnavailable",
    "swaps_for",
]
