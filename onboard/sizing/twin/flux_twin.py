"""The twin of a FLUX config: the gates' model when the full one (FLUX.1 is 11.9B) does not fit here.

Kept, because they are what the model computes: one double-stream and one single-stream block
at least (both kinds), the head width and the RoPE axes (so attention and its rotation are
FLUX's own), the latent channels and the guidance embedding. Shrunk: the block counts, the
head count (so the width), the text-encoder and pooled widths (inputs the synthetic data
makes anyway) and the sample (image and text tokens). The rows say each, with why.
"""

from __future__ import annotations

from typing import Any

HEADS = 2
"""Attention heads of the twin: the width is 2 x head_dim (256 for FLUX.1)."""
TEXT_WIDTH = 64
"""joint_attention_dim and pooled_projection_dim of the twin (T5's 4096 and CLIP's 768 in FLUX.1)."""
SAMPLE = {"latent_height": 8, "latent_width": 8, "text_len": 16}
"""The twin's sample: 64 image tokens and 16 text tokens (FLUX.1 at 1024 px: 4096 and 512)."""


def derive_flux_twin(
    cfg: dict[str, Any], adapter: Any, *, layers: int | None = None, width: int | None = None,
    experts: int | None = None,
) -> tuple[dict[str, Any], list[tuple[str, Any, Any, str]]]:
    """(the twin's config, its rows: (key, full, twin, why)) of the diffusers config `cfg` as
    `adapter` reads it (FluxArgs; onboard/sizing/twin/derive.py makes the Twin). `layers`: total
    blocks (split between the two kinds, both kept); `width` and `experts` are refused (the width
    follows the heads here; FLUX has no experts). ValueError for a knob out of range."""
    full = adapter.args_from_hf(cfg)[0]
    if experts is not None:
        raise ValueError("a FLUX model has no experts to halve")
    if width is not None:
        raise ValueError("--twin-width: a FLUX twin keeps head_dim and the RoPE axes, so its width is heads x head_dim")
    kinds = (full.n_double_layers > 0) + (full.n_single_layers > 0)
    total = kinds if layers is None else layers
    if not kinds <= total <= full.n_double_layers + full.n_single_layers:
        raise ValueError(f"--twin-layers {layers}: must be between {kinds} (one block of each kind) and "
                        f"{full.n_double_layers + full.n_single_layers}")  # fmt: skip
    double = min(full.n_double_layers, max(1 if full.n_double_layers else 0, total // 2))
    single = min(full.n_single_layers, total - double)
    double = total - single
    why_layers = "one block of each kind (double- and single-stream)" if layers is None else "--twin-layers"
    changes = {
        "num_layers": (double, why_layers),
        "num_single_layers": (single, why_layers),
        "num_attention_heads": (min(full.n_heads, HEADS), "fewer heads; head_dim and the RoPE axes kept"),
        "joint_attention_dim": (min(full.joint_attention_dim, TEXT_WIDTH), "the text encoder's width: synthetic input"),
        "pooled_projection_dim": (min(full.pooled_projection_dim, TEXT_WIDTH), "the pooled text width: synthetic input"),
        **{k: (min(getattr(full, k), v), "the sample: fewer image and text tokens per step") for k, v in SAMPLE.items()},
    }
    twin, rows = dict(cfg), []
    for key, (value, why) in changes.items():
        old = cfg.get(key, getattr(full, key, None))
        if value != old:
            twin[key] = value
            rows.append((key, old, value, why))
    kept = ("attention_head_dim", "axes_dims_rope", "in_channels", "guidance_embeds")
    return twin, rows + [(k, cfg[k], cfg[k], "kept") for k in kept if k in cfg]
