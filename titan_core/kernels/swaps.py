"""The kernels section as swaps: every kernel registered under its swap name, and
`swaps_for(cfg.kernels)` turning the section into the names `apply_swaps` takes.

Settings (ce_chunk, z_loss) are part of the swap name, e.g.
`loss.fused_ce(chunk=512,z_loss=0.0001)`, so the swap log says exactly what was applied.
Nothing here imports jax: the tokamax and splash modules import it when they first run.
"""

from __future__ import annotations

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Kernels
from titan_core.config.swaps import register_swap, registered_swaps
from titan_core.kernels.attention import FlexAttention, SplashAttention, TokamaxAttention
from titan_core.kernels.fused_ce import FusedCrossEntropyHead, ZLossCrossEntropyHead
from titan_core.kernels.moe import GroupedMMExperts, TokamaxExperts
from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.models.common import moe_static  # noqa: F401  (registers the capture-friendly `moe.dense` swap)

ATTENTION_PATH = "layers.*.attention.core"
EXPERTS_PATH = "layers.*.moe.experts"
LOSS_PATH = "loss_head"

register_swap("attention.naive", ATTENTION_PATH, "explicit-softmax reference attention")(
    lambda old, path: NaiveAttention()
)
register_swap("attention.sdpa", ATTENTION_PATH, "torch scaled_dot_product_attention")(lambda old, path: SDPAttention())
register_swap("attention.tokamax", ATTENTION_PATH, "tokamax dot_product_attention through the JAX bridge")(
    lambda old, path: TokamaxAttention()
)
register_swap("attention.splash", ATTENTION_PATH, "TPU Pallas splash attention through TorchTPU")(
    lambda old, path: SplashAttention()
)
register_swap("attention.flex", ATTENTION_PATH, "torch FlexAttention with a block mask")(
    lambda old, path: FlexAttention()
)
register_swap("moe.grouped_mm", EXPERTS_PATH, "experts as torch._grouped_mm over expert-sorted tokens")(
    lambda old, path: GroupedMMExperts(old)
)
register_swap("moe.tokamax", EXPERTS_PATH, "experts as tokamax ragged_dot through the JAX bridge")(
    lambda old, path: TokamaxExperts(old)
)

# The model's built-in modules: selecting one of these needs no swap.
DEFAULTS = {"attention": "sdpa", "loss": "plain", "moe": "loop"}
_DEFAULT_CHUNK = Kernels().ce_chunk


def _loss_swap(cfg: Kernels) -> str | None:
    """Register (once) and name the loss-head swap the section asks for, if any."""
    if cfg.ce_chunk <= 0:
        raise ConfigError(f"kernels.ce_chunk must be positive, got {cfg.ce_chunk}")
    if cfg.z_loss < 0:
        raise ConfigError(f"kernels.z_loss must be >= 0, got {cfg.z_loss}")
    if cfg.loss == "plain":
        if not cfg.z_loss:
            return None
        name, z = f"loss.plain(z_loss={cfg.z_loss!r})", cfg.z_loss
        factory = lambda old, path: ZLossCrossEntropyHead(old.final_softcap, old.ignore_index, z_loss=z)  # noqa: E731
        what = "plain cross-entropy plus z-loss"
    else:
        settings = [] if cfg.ce_chunk == _DEFAULT_CHUNK else [f"chunk={cfg.ce_chunk}"]
        settings += [f"z_loss={cfg.z_loss!r}"] if cfg.z_loss else []
        name = "loss.fused_ce" + (f"({','.join(settings)})" if settings else "")
        chunk, z = cfg.ce_chunk, cfg.z_loss
        factory = lambda old, path: FusedCrossEntropyHead(  # noqa: E731
            old.final_softcap, old.ignore_index, chunk=chunk, z_loss=z
        )
        what = "fused linear cross-entropy in token chunks"
    if name not in registered_swaps():
        register_swap(name, LOSS_PATH, what)(factory)
    return name


def swaps_for(cfg: Kernels) -> list[str]:
    """Swap names implied by the kernels section, then its explicit `swaps` list."""
    names = [
        f"{field}.{getattr(cfg, field)}" for field in ("attention", "moe") if getattr(cfg, field) != DEFAULTS[field]
    ]
    loss = _loss_swap(cfg)
    return ([loss] if loss else []) + names + list(cfg.swaps)
