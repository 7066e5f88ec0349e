"""Kernels, each a swap: one flag, comparable with the plain path it replaces."""

from titan_core.config.sections import Kernels
from titan_core.config.swaps import register_swap
from titan_core.models.common.attention import NaiveAttention, SDPAttention

register_swap("attention.naive", "layers.*.attention.core", "explicit-softmax reference attention")(
    lambda old, path: NaiveAttention()
)
register_swap("attention.sdpa", "layers.*.attention.core", "torch scaled_dot_product_attention")(
    lambda old, path: SDPAttention()
)

# The model's built-in modules: selecting one of these needs no swap.
DEFAULTS = {"attention": "sdpa", "loss": "plain", "moe": "loop"}


def swaps_for(cfg: Kernels) -> list[str]:
    """Swap names implied by the kernels section, then its explicit `swaps` list."""
    names = [f"{field}.{choice}" for field, choice in (("attention", cfg.attention), ("loss", cfg.loss), ("moe", cfg.moe)) if choice != DEFAULTS[field]]
    return names + list(cfg.swaps)
