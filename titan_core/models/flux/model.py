"""The FLUX transformer (a rectified-flow diffusion transformer) as a titan_core family.

Module paths (the adapter and the swaps name them): img_in, txt_in, time_in, guidance_in,
vector_in, layers.<i> (DoubleBlock for i < n_double_layers, then SingleBlock), final_mod,
proj_out. `loss` is the training entry point every family has: `tokens` are the clean
packed latents and `labels` mark each image token as a target, so the trainer's token mean
(titan_core/parallel/token_mean.py) weighs image tokens as it weighs text tokens; the
noise, the timesteps, the text conditioning (text, pooled) and, for a guidance-distilled
model, guidance come as keyword inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.protocol import ModelBase
from titan_core.models.flux.args import FluxArgs
from titan_core.models.flux.layers import MLP, TIME_CHANNELS, DoubleBlock, SingleBlock, rope_tables
from titan_core.models.flux.layers import timestep_sinusoid

TIME_SCALE = 1000.0
"""Timesteps in [0, 1] are embedded as t * 1000, as FLUX.1 was trained."""


class Flux(ModelBase):
    """A `ModelBase` (protocol.py) with no loss head (`loss_head` None: the flow loss is an MSE)
    and a FLOP count of its own (`flops_per_token`, per image token)."""

    def __init__(self, args: FluxArgs):
        super().__init__()
        self.args = args
        self.img_in = nn.Linear(args.in_channels, args.dim)
        self.txt_in = nn.Linear(args.joint_attention_dim, args.dim)
        self.time_in = MLP(TIME_CHANNELS, args.dim, args.dim, gelu=False)
        self.guidance_in = MLP(TIME_CHANNELS, args.dim, args.dim, gelu=False) if args.guidance_embeds else None
        self.vector_in = MLP(args.pooled_projection_dim, args.dim, args.dim, gelu=False)
        blocks = [DoubleBlock(args) for _ in range(args.n_double_layers)]
        blocks += [SingleBlock(args) for _ in range(args.n_single_layers)]
        self.layers = nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})
        self.final_mod = nn.Linear(args.dim, 2 * args.dim)
        self.proj_out = nn.Linear(args.dim, args.in_channels)
        cos, sin = rope_tables(args, device="meta")
        self.register_buffer("rope_cos", torch.empty_like(cos), persistent=False)
        self.register_buffer("rope_sin", torch.empty_like(sin), persistent=False)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Normal(0, init_std) weights and zero biases; the modulation and the output projection
        start at zero (adaLN-Zero: every block starts as the identity, the prediction as 0)."""
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.img_in.weight.device).manual_seed(seed)
        std = self.args.init_std
        for name, p in self.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if owner.endswith(("_norm", "q_norm", "k_norm")):
                p.fill_(1.0)
            elif leaf == "bias" or owner.endswith(("_mod", "modulation", "proj_out")):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)
        cos, sin = rope_tables(self.args, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def conditioning(self, timesteps, pooled, guidance=None) -> torch.Tensor:
        """[b, dim]: the timestep, guidance and pooled-text embeddings summed."""
        dtype = self.img_in.weight.dtype
        vec = self.time_in(timestep_sinusoid(timesteps * TIME_SCALE).to(dtype))
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError("this flux model embeds guidance (guidance_embeds) and got none")
            vec = vec + self.guidance_in(timestep_sinusoid(guidance * TIME_SCALE).to(dtype))
        return vec + self.vector_in(pooled.to(dtype))

    def forward(self, latents, *, timesteps, text, pooled, guidance=None):
        """The predicted velocity [b, image_tokens, in_channels] for noisy packed latents."""
        cfg = self.args
        if latents.shape[1] != cfg.image_tokens or text.shape[1] != cfg.text_len:
            raise ValueError(
                f"flux expects {cfg.image_tokens} image tokens and {cfg.text_len} text tokens per sample, "
                f"got {latents.shape[1]} and {text.shape[1]}"
            )
        dtype = self.img_in.weight.dtype
        img = self.img_in(latents.to(dtype))
        txt = self.txt_in(text.to(dtype))
        vec = self.conditioning(timesteps, pooled, guidance)
        cos, sin = self.rope_cos, self.rope_sin
        blocks = list(self.layers.values())
        doubles, singles = blocks[: cfg.n_double_layers], blocks[cfg.n_double_layers :]
        for block in doubles:
            img, txt = block(img, txt, vec, cos, sin)
        x = torch.cat([txt, img], dim=1)
        for block in singles:
            x = block(x, vec, cos, sin)
        img = x[:, cfg.text_len :]
        scale, shift = self.final_mod(F.silu(vec)).chunk(2, dim=1)
        img = F.layer_norm(img, img.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out(img)

    def loss(self, tokens, labels, *, positions=None, segment_ids=None, noise, timesteps, text, pooled, guidance=None):
        """Rectified-flow loss: the mean squared error of the predicted velocity (noise - latents)
        at x_t = (1 - t) latents + t noise. Returns (loss, loss): there is no auxiliary term.

        tokens: clean packed latents [b, image_tokens, in_channels]; labels [b, image_tokens]
        (-100 drops a token from the mean, like a text label). positions and segment_ids do not
        apply (images are not packed) and must be None."""
        if positions is not None or segment_ids is not None:
            raise ValueError("flux samples are not packed documents: positions and segment_ids must be None")
        t = timesteps.float()[:, None, None]
        noisy = (1 - t) * tokens.float() + t * noise.float()
        pred = self(noisy, timesteps=timesteps, text=text, pooled=pooled, guidance=guidance).float()
        err = (pred - (noise.float() - tokens.float())).pow(2).mean(-1)
        keep = (labels != -100).float()
        mse = (err * keep).sum() / keep.sum()
        return mse, mse

    def flops_per_sample(self) -> float:
        """Training FLOPs of one sample (forward + backward): 6 per weight per token that passes
        it, plus the attention scores and values (12 * seq^2 * dim per block, dense)."""
        cfg = self.args
        d, h, n_img, n_txt = cfg.dim, cfg.mlp_hidden_dim, cfg.image_tokens, cfg.text_len
        seq, blocks = n_img + n_txt, cfg.n_double_layers + cfg.n_single_layers
        # both block kinds pass each token through 4 d^2 + 2 d h weights (qkv + out + mlp; single:
        # qkv + mlp_in + out over attention and mlp)
        per_token = blocks * (4 * d * d + 2 * d * h)
        weights = seq * per_token + n_img * 2 * cfg.in_channels * d + n_txt * cfg.joint_attention_dim * d
        # once per sample: modulation, the final modulation and the conditioning embedders
        embedders = (2 if cfg.guidance_embeds else 1) * (TIME_CHANNELS * d + d * d) + cfg.pooled_projection_dim * d + d * d
        weights += cfg.n_double_layers * 12 * d * d + cfg.n_single_layers * 3 * d * d + 2 * d * d + embedders
        return 6.0 * weights + 12.0 * blocks * seq * seq * d

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per image token (`flops_per_sample` / image tokens): the trainer's tokens
        of a flux run are image tokens. `seq_len` is ignored: a sample's size is the config's."""
        return self.flops_per_sample() / self.args.image_tokens
