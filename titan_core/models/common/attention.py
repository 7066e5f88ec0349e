"""Grouped-query attention with optional QK-norm, bias, sliding window and RoPE skip.

The score computation lives in a separate `core` module so kernels can replace it through
the swap registry (`layers.*.attention.core`) while projections and RoPE stay put.

The core contract, which every attention kernel and a port's own core keep:

    core(q, k, v, *, scale, window, segment_ids[, softcap]) -> out
      q            [batch, n_heads, seq, head_dim]     after QK-norm and RoPE
      k, v         [batch, n_kv_heads, seq, head_dim]  not repeated for GQA: query head h reads
                   kv head h // (n_heads // n_kv_heads)
      scale        float multiplying q @ k^T (Attention.scale = head_dim ** -0.5)
      window       None, or keep keys with q_pos - k_pos < window (the query itself counts)
      segment_ids  None, or [batch, seq] ids of packed documents: attend within the same id only
      softcap      given only when the model caps its scores (Gemma-2's attn_logit_softcapping):
                   scores become cap * tanh(q @ k^T * scale / cap) before the mask. A core that
                   cannot cap raises KernelRefusesModel (the kernel does not apply to the model);
                   a core written before this argument is never passed it by an uncapped model
      causal       given only when False (a model whose every query sees every key: FLUX's joint
                   attention); a core that cannot drop the causal mask raises KernelRefusesModel
      out          [batch, n_heads, seq, head_dim] in q's dtype
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.mapping_errors import KernelRefusesModel
from titan_core.models.common.layers import RMSNorm, apply_rope, softcap as cap_scores


def attention_mask(
    seq_len: int,
    *,
    window: int | None = None,
    segment_ids: torch.Tensor | None = None,
    device: torch.device | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """Boolean mask, True where a query may attend: [1 or batch, 1, q, k].

    Causal unless `causal` is False; `window` keeps keys with q - k < window (the query
    itself counts); `segment_ids` [batch, seq] keeps keys of the same packed document.
    """
    pos = torch.arange(seq_len, device=device)
    return mask_from_positions(pos, pos, window=window, q_segments=segment_ids, k_segments=segment_ids, causal=causal)


def mask_from_positions(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    *,
    window: int | None = None,
    q_segments: torch.Tensor | None = None,
    k_segments: torch.Tensor | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """`attention_mask` for queries and keys at given positions in the row ([q], [k] int64; in any
    order, as context parallel holds them) and their segment ids ([batch, q], [batch, k]): [1 or batch, 1, q, k]."""
    q, k = q_pos[:, None], k_pos[None, :]
    allowed = k <= q if causal else torch.ones(q.shape[0], k.shape[1], dtype=torch.bool, device=q.device)
    if window:
        allowed = allowed & (q - k < window)
    allowed = allowed[None, None]
    if q_segments is not None:
        same_doc = q_segments[:, None, :, None] == k_segments[:, None, None, :]
        allowed = allowed & same_doc
    return allowed


def refuse_bidirectional(kernel: str, causal: bool) -> None:
    """Raise KernelRefusesModel when a core that masks causally always is asked not to."""
    if not causal:
        raise KernelRefusesModel(
            f"kernels.attention={kernel} masks causally always and this model's attention is bidirectional "
            "(every query sees every key); kernels.attention=naive, sdpa, tokamax or flex drop the causal mask"
        )


def refuse_softcap(kernel: str, cap: float | None) -> None:
    """Raise KernelRefusesModel when a core that cannot cap scores is asked to."""
    if cap:
        raise KernelRefusesModel(
            f"kernels.attention={kernel} cannot soft-cap attention scores and this model caps them at {cap} "
            "(attn_logit_softcapping); kernels.attention=naive (and flex where it can train) apply the cap"
        )


class NaiveAttention(nn.Module):
    """Reference core: explicit softmax(q k^T * scale + mask) v, softmax in fp32 (or fp64), output in
    the input dtype; the plain path every attention kernel is compared with. Honours `softcap`
    (scaled, divided and capped in that order, as transformers' eager attention rounds) and
    attention `sinks`: a logit per head ([N]) or per query ([B, N, S, 1]) that joins every
    softmax as one more key with no value, so a query may attend to nothing (GPT-OSS), and an
    additive score `bias` broadcastable to [B, N, S, S] (a learned relative-position bias, Inkling)."""

    def forward(
        self,
        q,
        k,
        v,
        *,
        scale: float,
        window: int | None,
        segment_ids,
        softcap: float | None = None,
        sinks=None,
        bias=None,
        causal: bool = True,
    ):
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = cap_scores((q @ k.transpose(-2, -1)) * scale, softcap)
        if bias is not None:
            scores = scores + bias
        if causal or window or segment_ids is not None:  # else the bias is the whole mask (keys may outnumber queries)
            mask = attention_mask(q.shape[2], window=window, segment_ids=segment_ids, device=q.device, causal=causal)
            scores = scores.masked_fill(~mask, float("-inf"))
        # softmax in fp32 at least: fp64 stays fp64 (a plain path run in fp64 as the exact reference)
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        if sinks is None:
            return torch.softmax(scores, dim=-1).to(q.dtype) @ v
        sink = (sinks.reshape(1, -1, 1, 1) if sinks.dim() == 1 else sinks).float()
        sink = sink.expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return probs.to(q.dtype) @ v


class SDPAttention(nn.Module):
    """scaled_dot_product_attention; the plain causal fast path when no other mask applies.

    GQA goes through `enable_gqa` so the kernel indexes shared KV heads instead of
    materialising repeated copies of them.
    """

    def forward(
        self, q, k, v, *, scale: float, window: int | None, segment_ids, softcap: float | None = None, causal=True
    ):
        refuse_softcap("sdpa", softcap)
        gqa = q.shape[1] != k.shape[1]
        if window is None and segment_ids is None:
            return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
        mask = attention_mask(q.shape[2], window=window, segment_ids=segment_ids, device=q.device, causal=causal)
        return sdpa(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention; bf16 on a CPU runs on the values upcast to fp32 (`_cpu_bf16`)."""
    if _cpu_bf16(q):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _cpu_bf16(q: torch.Tensor) -> bool:
    """bf16 on CPU: SDPA runs on the values upcast to fp32.

    Measured on an AVX512-BF16 CPU with torch 2.13 (llama3 debugmodel, 20 steps on a repeated
    batch, bf16 params vs fp32, 7 seeds): with the bf16 flash kernel the worst per-step loss gap
    averaged 2.1% (up to 4.6%), with the bf16 math backend 1.3% (worst 2.1%); and at head_dim 16 the
    math backend's batched matmuls were a fifth of the whole bf16 step. The fp32 flash kernel on the
    upcast values is as exact as the math backend (q's gradient 0.382% off fp64 in one call, as math's;
    bf16 flash 0.443%) and took the demo model's compiled bf16 step (batch 8, 2 threads) from 2.27x to
    2.83x the throughput of its fp32 eager baseline (each figure interleaved in one process), so a bf16
    model on a CPU attends in fp32. Accelerators keep their bf16 kernels.
    """
    return q.device.type == "cpu" and q.dtype == torch.bfloat16


class Attention(nn.Module):
    """Grouped-query attention: projections, optional per-head QK-norm, RoPE, then `core`.

    forward(x [batch, seq, dim], cos, sin [batch, seq, head_dim], segment_ids) -> [batch, seq, dim]:
    wq/wk/wv (nn.Linear, weight [out, in]) give q [b, s, n_heads, head_dim] and k, v
    [b, s, n_kv_heads, head_dim]; `q_norm`/`k_norm` (RMSNorm over head_dim, so per head)
    normalise them before RoPE when `qk_norm`; RoPE uses the half-split layout (`apply_rope`)
    unless `use_rope` is False for this layer; `core` (the contract above) attends; `wo` maps
    back. A full-width QK-norm (one RMSNorm over n_heads * head_dim, as OLMo-2 has) is not
    this module's: a port normalises the projections before the per-head view itself.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool = False,
        out_bias: bool = False,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        window: int | None = None,
        use_rope: bool = True,
        softcap: float | None = None,
    ):
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.window = window
        self.use_rope = use_rope
        self.softcap = softcap or None
        self.scale = head_dim**-0.5
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=qkv_bias)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=qkv_bias)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=out_bias)
        self.q_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None
        # a capped model starts on the reference core, which caps; sdpa cannot
        self.core = NaiveAttention() if self.softcap else SDPAttention()

    def forward(self, x, cos, sin, segment_ids=None):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.use_rope:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        capped = {"softcap": self.softcap} if self.softcap else {}  # a port's older core takes no softcap
        out = self.core(q, k, v, scale=self.scale, window=self.window, segment_ids=segment_ids, **capped)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))
