"""FLUX's pieces: timestep sinusoid, MLP embedders, 3-axis RoPE, joint attention, modulated blocks.

Written from the FLUX.1 architecture (Black Forest Labs) as diffusers' FluxTransformer2DModel
computes it, so that one adapter maps its weights by renames only. Attention goes through a
`core` with the contract of models/common/attention.py, called with `causal=False` (every
query sees every key), so the attention kernels swap in at `layers.*.attention.core`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.attention import SDPAttention
from titan_core.models.common.layers import RMSNorm
from titan_core.models.flux.args import FluxArgs

TIME_CHANNELS = 256
"""Width of the timestep (and guidance) sinusoid."""


def timestep_sinusoid(t: torch.Tensor, channels: int = TIME_CHANNELS, max_period: float = 10000.0) -> torch.Tensor:
    """[N] values -> [N, channels] fp32: cos half first, then sin (FLUX's flipped layout)."""
    half = channels // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t.float()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class MLP(nn.Module):
    """w2(act(w1 x)): the embedders (silu; in_dim -> dim -> dim) and both streams' MLPs (gelu_tanh; dim -> hidden -> dim)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, *, gelu: bool):
        super().__init__()
        self.gelu = gelu
        self.w1 = nn.Linear(in_dim, hidden)
        self.w2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w1(x)
        return self.w2(F.gelu(h, approximate="tanh") if self.gelu else F.silu(h))


def rope_tables(cfg: FluxArgs, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [text_len + image_tokens, head_dim] fp32 for FLUX's positions.

    Text tokens sit at (0, 0, 0); image token (r, c) at (0, r, c). Each axis rotates its own
    slice of head_dim (axes_dims_rope) with pairs of adjacent channels sharing a frequency;
    the angles are taken in fp64, as the reference does, then rounded to fp32.
    """
    rows = torch.arange(cfg.latent_height, device=device).repeat_interleave(cfg.latent_width)
    cols = torch.arange(cfg.latent_width, device=device).repeat(cfg.latent_height)
    img = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1)
    ids = torch.cat([torch.zeros(cfg.text_len, 3, dtype=img.dtype, device=device), img]).double()
    cos, sin = [], []
    for axis, width in enumerate(cfg.axes_dims_rope):
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, width, 2, dtype=torch.float64, device=device) / width))
        angles = ids[:, axis, None] * inv[None, :]
        cos.append(angles.cos().repeat_interleave(2, dim=-1))
        sin.append(angles.sin().repeat_interleave(2, dim=-1))
    return torch.cat(cos, dim=-1).float(), torch.cat(sin, dim=-1).float()


def apply_pair_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim] rotated pairwise (channels 2i, 2i+1); cos/sin [seq, head_dim]; fp32 math."""
    pairs = x.float().unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return (x.float() * cos + rotated * sin).to(x.dtype)


class Projections(nn.Module):
    """q, k, v of one stream with per-head RMSNorm on q and k."""

    def __init__(self, dim: int, n_heads: int, head_dim: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim)
        self.wk = nn.Linear(dim, n_heads * head_dim)
        self.wv = nn.Linear(dim, n_heads * head_dim)
        self.q_norm = RMSNorm(head_dim, 1e-6)
        self.k_norm = RMSNorm(head_dim, 1e-6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[b, s, dim] -> q, k, v as [b, heads, s, head_dim]."""
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, self.n_heads, self.head_dim)

        q, k, v = self.q_norm(heads(self.wq(x))), self.k_norm(heads(self.wk(x))), heads(self.wv(x))
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


class JointAttention(nn.Module):
    """Bidirectional attention over text + image tokens.

    Double-stream (`two_streams`): each stream has its own projections (`qkv`, `txt_qkv`) and
    output (`wo`, `txt_wo`); the text tokens go first in the joint sequence. Single-stream:
    one set of projections over the already joined sequence and no output projection (the
    block's `out` takes the attention and MLP outputs together).
    """

    def __init__(self, cfg: FluxArgs, *, two_streams: bool):
        super().__init__()
        self.qkv = Projections(cfg.dim, cfg.n_heads, cfg.head_dim)
        self.txt_qkv = Projections(cfg.dim, cfg.n_heads, cfg.head_dim) if two_streams else None
        self.wo = nn.Linear(cfg.dim, cfg.dim) if two_streams else None
        self.txt_wo = nn.Linear(cfg.dim, cfg.dim) if two_streams else None
        self.scale = cfg.head_dim**-0.5
        self.core = SDPAttention()

    def _attend(self, q, k, v, cos, sin) -> torch.Tensor:
        q, k = apply_pair_rope(q, cos, sin), apply_pair_rope(k, cos, sin)
        out = self.core(q, k, v, scale=self.scale, window=None, segment_ids=None, causal=False)
        return out.transpose(1, 2).flatten(2)

    def forward(self, x, cos, sin, txt=None):
        """Single-stream: x is the joint sequence; returns the attention output [b, s, dim].
        Double-stream: x is the image stream, txt the text stream; returns (image out, text out)."""
        if self.txt_qkv is None:
            return self._attend(*self.qkv(x), cos, sin)
        qi, ki, vi = self.qkv(x)
        qt, kt, vt = self.txt_qkv(txt)
        joint = self._attend(torch.cat([qt, qi], 2), torch.cat([kt, ki], 2), torch.cat([vt, vi], 2), cos, sin)
        n_txt = txt.shape[1]
        return self.wo(joint[:, n_txt:]), self.txt_wo(joint[:, :n_txt])


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """LayerNorm (no affine, eps 1e-6) of x, scaled by 1 + scale and shifted, per sample."""
    return F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]


class DoubleBlock(nn.Module):
    """Image and text streams with their own modulation, attention projections and MLPs, attending jointly."""

    def __init__(self, cfg: FluxArgs):
        super().__init__()
        self.img_mod = nn.Linear(cfg.dim, 6 * cfg.dim)
        self.txt_mod = nn.Linear(cfg.dim, 6 * cfg.dim)
        self.attention = JointAttention(cfg, two_streams=True)
        self.img_mlp = MLP(cfg.dim, cfg.mlp_hidden_dim, cfg.dim, gelu=True)
        self.txt_mlp = MLP(cfg.dim, cfg.mlp_hidden_dim, cfg.dim, gelu=True)

    def forward(self, img, txt, vec, cos, sin):
        """img [b, s_img, dim], txt [b, s_txt, dim], vec [b, dim] -> (img, txt)."""
        act = F.silu(vec)
        i_shift, i_scale, i_gate, i_shift2, i_scale2, i_gate2 = self.img_mod(act).chunk(6, dim=1)
        t_shift, t_scale, t_gate, t_shift2, t_scale2, t_gate2 = self.txt_mod(act).chunk(6, dim=1)
        img_attn, txt_attn = self.attention(modulate(img, i_shift, i_scale), cos, sin, modulate(txt, t_shift, t_scale))
        img = img + i_gate[:, None] * img_attn
        img = img + i_gate2[:, None] * self.img_mlp(modulate(img, i_shift2, i_scale2))
        txt = txt + t_gate[:, None] * txt_attn
        txt = txt + t_gate2[:, None] * self.txt_mlp(modulate(txt, t_shift2, t_scale2))
        return img, txt


class SingleBlock(nn.Module):
    """One stream over text + image: attention and MLP side by side, joined by one output projection."""

    def __init__(self, cfg: FluxArgs):
        super().__init__()
        self.modulation = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.attention = JointAttention(cfg, two_streams=False)
        self.mlp_in = nn.Linear(cfg.dim, cfg.mlp_hidden_dim)
        self.out = nn.Linear(cfg.dim + cfg.mlp_hidden_dim, cfg.dim)

    def forward(self, x, vec, cos, sin):
        """x [b, s_txt + s_img, dim], vec [b, dim] -> x."""
        shift, scale, gate = self.modulation(F.silu(vec)).chunk(3, dim=1)
        h = modulate(x, shift, scale)
        mlp = F.gelu(self.mlp_in(h), approximate="tanh")
        return x + gate[:, None] * self.out(torch.cat([self.attention(h, cos, sin), mlp], dim=-1))
