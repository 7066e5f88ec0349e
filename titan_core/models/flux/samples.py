"""Synthetic rectified-flow samples for a flux model: no autoencoder, no text encoder.

Row g is drawn from its own generator seeded by (seed, g) (the loader contract of
titan_core/data/base.py): clean packed latents and noise [image_tokens, in_channels], the
timestep as the sigmoid of a standard normal (the logit-normal sampling FLUX-style training
uses), text embeddings [text_len, joint_attention_dim], a pooled embedding and, for a
guidance-distilled model, a guidance scale in [1, 5]. Every image token is a target (labels 0;
-100 would drop one). `FluxArgs.own_samples` builds this loader, so the trainer asks the model's
args for its samples and never names flux.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from titan_core.config.loader import ConfigError
from titan_core.data.base import RowLoader, mix_seed


class SampleSizes(Protocol):
    """The sizes a flow sample is drawn in (FluxArgs has them; args.py imports this module)."""

    image_tokens: int
    in_channels: int
    text_len: int
    joint_attention_dim: int
    pooled_projection_dim: int
    guidance_embeds: bool
    latent_height: int
    latent_width: int


class FlowLoader(RowLoader):
    def __init__(self, *, flux: SampleSizes, seed: int, **kw):
        super().__init__(**kw)
        if self.seq_len != flux.image_tokens:
            raise ConfigError(
                f"training.seq_len = {self.seq_len}, but a flux sample has {flux.image_tokens} image tokens "
                f"(latent_height {flux.latent_height} x latent_width {flux.latent_width}); set training.seq_len = "
                f"{flux.image_tokens}"
            )
        self.flux = flux
        self.seed = seed

    def row(self, g: int):
        f = self.flux
        gen = torch.Generator().manual_seed(mix_seed(self.seed, g))

        def normal(*shape):
            return torch.randn(*shape, generator=gen)

        latents = normal(f.image_tokens, f.in_channels)
        inputs = {
            "noise": normal(f.image_tokens, f.in_channels),
            "timesteps": torch.sigmoid(normal(())),
            "text": normal(f.text_len, f.joint_attention_dim),
            "pooled": normal(f.pooled_projection_dim),
        }
        if f.guidance_embeds:
            inputs["guidance"] = 1.0 + 4.0 * torch.rand((), generator=gen)
        labels = torch.zeros(f.image_tokens, dtype=torch.int64)
        return latents, labels, None, None, inputs

    def _identity(self) -> dict[str, Any]:
        return {
            "source": "flow", "seed": self.seed, "image_tokens": self.flux.image_tokens,
            "in_channels": self.flux.in_channels, "text_len": self.flux.text_len, "batch_size": self.batch_size,
            "dp_rank": self.dp_rank, "dp_world": self.dp_world, "repeat_batch": self.repeat_batch,
        }  # fmt: skip
