"""The kernels section as swaps: every kernel registered under its swap name, and
`swaps_for(cfg.kernels)` turning the section into the names `apply_swaps` takes.

Settings (ce_chunk, z_loss) are part of the swap name, e.g.
`loss.fused_ce(chunk=512,z_loss=0.0001)`, so the swap log says exactly what was applied.
Each swap replaces only the library's module at its path or another kernel for it
(`replaces`); a model's own module there (another class) makes `apply_swaps` refuse.
Nothing here imports jax: the tokamax and splash modules import it when they first run.
"""

from __future__ import annotations

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Kernels
from titan_core.models.common.swaps import register_swap, registered_swaps
from titan_core.kernels.attention import FlexAttention, SplashAttention, TokamaxAttention
from titan_core.kernels.float8 import float8_swap
from titan_core.kernels.fused_ce import FusedCrossEntropyHead, ZLossCrossEntropyHead
from titan_core.kernels.moe import GroupedMMExperts, TokamaxExperts
from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.models.common.layers import CrossEntropyHead
from titan_core.models.common.moe import Experts
from titan_core.models.common.moe_static import DenseExperts  # also registers the capture-friendly `moe.dense` swap

ATTENTION_PATH = "layers.*.attention.core"
EXPERTS_PATH = "layers.*.moe.experts"
LOSS_PATH = "loss_head"

#: The classes each path's swaps replace: the library's module there and every kernel for it.
#: A model's own module at one of these paths (another class) is never replaced.
ATTENTION_CORES = (SDPAttention, NaiveAttention, TokamaxAttention, SplashAttention, FlexAttention)
EXPERTS = (Experts, DenseExperts, GroupedMMExperts, TokamaxExperts)
LOSS_HEADS = (CrossEntropyHead, ZLossCrossEntropyHead, FusedCrossEntropyHead)


def _attention(name: str, description: str, cls: type) -> None:
    register_swap(name, ATTENTION_PATH, description, replaces=ATTENTION_CORES, produces=cls)(lambda old, path: cls())


_attention("attention.naive", "explicit-softmax reference attention", NaiveAttention)
_attention("attention.sdpa", "torch scaled_dot_product_attention", SDPAttention)
_attention("attention.tokamax", "tokamax dot_product_attention through the JAX bridge", TokamaxAttention)
_attention("attention.splash", "TPU Pallas splash attention through TorchTPU", SplashAttention)
_attention("attention.flex", "torch FlexAttention with a block mask", FlexAttention)
register_swap(
    "moe.grouped_mm",
    EXPERTS_PATH,
    "experts as torch._grouped_mm over expert-sorted tokens",
    replaces=EXPERTS,
    produces=GroupedMMExperts,
)(lambda old, path: GroupedMMExperts(old))
register_swap(
    "moe.tokamax",
    EXPERTS_PATH,
    "experts as tokamax ragged_dot through the JAX bridge",
    replaces=EXPERTS,
    produces=TokamaxExperts,
)(lambda old, path: TokamaxExperts(old))

# The model's built-in modules: selecting one of these needs no swap.
DEFAULTS = {"attention": "sdpa", "loss": "plain", "moe": "loop", "float8": "none"}
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
        what, cls = "plain cross-entropy plus z-loss", ZLossCrossEntropyHead
    else:
        settings = [] if cfg.ce_chunk == _DEFAULT_CHUNK else [f"chunk={cfg.ce_chunk}"]
        settings += [f"z_loss={cfg.z_loss!r}"] if cfg.z_loss else []
        name = "loss.fused_ce" + (f"({','.join(settings)})" if settings else "")
        chunk, z = cfg.ce_chunk, cfg.z_loss
        factory = lambda old, path: FusedCrossEntropyHead(  # noqa: E731
            old.final_softcap, old.ignore_index, chunk=chunk, z_loss=z
        )
        what, cls = "fused linear cross-entropy in token chunks", FusedCrossEntropyHead
    if name not in registered_swaps():
        register_swap(name, LOSS_PATH, what, replaces=LOSS_HEADS, produces=cls)(factory)
    return name


def swaps_for(cfg: Kernels) -> list[str]:
    """Swap names implied by the kernels section, then its explicit `swaps` list."""
    names = [
        f"{field}.{getattr(cfg, field)}" for field in ("attention", "moe") if getattr(cfg, field) != DEFAULTS[field]
    ]
    if cfg.float8 != DEFAULTS["float8"]:  # after the module kernels: it takes only linears, which they are not
        names.append(float8_swap(cfg.float8))
    loss = _loss_swap(cfg)
    return ([loss] if loss else []) + names + list(cfg.swaps)
