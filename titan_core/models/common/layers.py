"""Building blocks shared by the decoder families: norm, rotary embedding, MLP, loss head."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back, as the upstream checkpoints were trained."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """Inverse frequencies, with optional llama3-style long-context scaling.

    `scaling` keys (llama3): factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings. Long wavelengths are divided by `factor`, short ones
    kept, and the band between them blended smoothly.
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, blended, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos/sin of shape [..., seq, head_dim] in the half-split layout (first half, second half)."""
    freqs = positions.float()[..., None] * inv_freq.float().to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, heads, seq, head_dim]; cos/sin: [batch, seq, head_dim]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x), [..., dim] -> [..., dim].

    w1 is HF's gate_proj, w3 its up_proj, w2 its down_proj (nn.Linear, weight [out, in]).
    Also the shared expert of `MoE`. Another activation or a non-gated MLP is a port's own module.
    """

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w3 = nn.Linear(dim, hidden_dim, bias=bias)
        self.w2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if not cap else torch.tanh(logits / cap) * cap


class CrossEntropyHead(nn.Module):
    """Plain loss head: full logits from the output weight, optional soft-cap, mean CE.

    It receives the final hidden states and the output-head weight (not logits) so a
    fused kernel can replace it through the swap registry without touching the model.
    """

    def __init__(self, final_softcap: float | None = None, ignore_index: int = -100):
        super().__init__()
        self.final_softcap = final_softcap
        self.ignore_index = ignore_index

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = softcap(F.linear(hidden, weight), self.final_softcap)
        return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=self.ignore_index)
