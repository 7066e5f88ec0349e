"""FLUX sizes. `debugmodel` is the CPU test shape; `dev` and `schnell` are FLUX.1's (11.9B parameters)
at 1024 x 1024 pixels (64 x 64 packed latent tokens) with 512 text tokens."""

from titan_core.models.flux.args import FluxArgs

FLAVORS = {
    # guidance_embeds on, so the debug model exercises every module FLUX.1-dev has
    "debugmodel": FluxArgs(
        in_channels=64, n_double_layers=2, n_single_layers=2, n_heads=4, head_dim=16, axes_dims_rope=(4, 6, 6),
        joint_attention_dim=64, pooled_projection_dim=32, guidance_embeds=True,
        latent_height=8, latent_width=8, text_len=16,
    ),
    "dev": FluxArgs(guidance_embeds=True),
    "schnell": FluxArgs(guidance_embeds=False),
}  # fmt: skip
