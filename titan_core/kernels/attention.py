"""Attention cores beyond the model's built-in sdpa/naive: tokamax, splash, flex.

Each is a drop-in for `layers.*.attention.core`: called as core(q, k, v, scale=, window=,
segment_ids=[, softcap=]) with q [B, N, S, D], k/v [B, K, S, D], returning [B, N, S, D] (the
contract in titan_core/models/common/attention.py). None owns parameters, so swapping one in
leaves the state dict untouched. flex honours a score soft-cap; tokamax and splash refuse one.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from titan_core.models.common.attention import refuse_bidirectional, refuse_softcap
from titan_core.models.common.mapping_errors import KernelRefusesModel, KernelUnavailable

__all__ = ["KernelRefusesModel", "KernelUnavailable", "FlexAttention", "SplashAttention", "TokamaxAttention"]


def import_jax_kernels(module: str, flag: str):
    """Import a JAX-backed kernel module, or say which extra is missing."""
    try:
        return importlib.import_module(f"titan_core.kernels.{module}")
    except ImportError as e:
        raise KernelUnavailable(f"{flag} needs jax and tokamax ({e}): pip install 'titan-onboard[jax]'") from e


def jax_kernels_or_reason(module: str, flag: str):
    """The kernel module, or the KernelUnavailable to raise when the kernel is called.

    Kernels look their module up when they are built, not in forward: an import inside
    forward is a call dynamo will not trace, so every compiled block would break there.
    """
    try:
        return import_jax_kernels(module, flag)
    except KernelUnavailable as e:
        return e


class TokamaxAttention(nn.Module):
    """tokamax.dot_product_attention through the JAX bridge.

    `implementation` "device" picks per call: xla on CPU (tokamax's Pallas kernels refuse
    CPU), mosaic on TPU, tokamax's own choice elsewhere.
    """

    def __init__(self, implementation: str = "device"):
        super().__init__()
        self.implementation = implementation
        self._ops = jax_kernels_or_reason("tokamax_ops", "kernels.attention=tokamax")

    def forward(
        self, q, k, v, *, scale: float, window: int | None, segment_ids, softcap: float | None = None, causal=True
    ):
        refuse_softcap("tokamax", softcap)
        if isinstance(self._ops, KernelUnavailable):
            raise self._ops
        tokamax_attention = self._ops.tokamax_attention
        impl = self.implementation
        if impl == "device":
            impl = {"cpu": "xla", "tpu": "mosaic"}.get(q.device.type, "auto")
        # tokamax wants [B, S, heads, D]; the projections produced exactly that memory
        # layout, so these transposes are free views.
        out = tokamax_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            segment_ids,
            scale=float(scale),
            window=int(window or 0),
            causal=bool(causal),
            implementation=impl,
        )
        return out.transpose(1, 2)

    def extra_repr(self) -> str:
        return f"implementation={self.implementation}"


class SplashAttention(nn.Module):
    """The TPU Pallas splash kernel through TorchTPU; `interpret=True` runs it anywhere (slowly)."""

    def __init__(self, interpret: bool = False):
        super().__init__()
        self.interpret = interpret

    def forward(
        self, q, k, v, *, scale: float, window: int | None, segment_ids, softcap: float | None = None, causal=True
    ):
        refuse_softcap("splash", softcap)
        refuse_bidirectional("splash", causal)
        if q.device.type != "tpu" and not self.interpret:
            raise KernelUnavailable(
                f"kernels.attention=splash is the TPU Pallas splash kernel and needs device.type = tpu "
                f"(tensors are on {q.device.type}); choose attention=sdpa, tokamax or flex here"
            )
        splash_attention = import_jax_kernels("splash", "kernels.attention=splash").splash_attention
        return splash_attention(
            q, k, v, segment_ids, scale=float(scale), window=int(window or 0), interpret=self.interpret
        )

    def extra_repr(self) -> str:
        return f"interpret={self.interpret}"


def flex_mask_mod(window: int | None, segment_ids: torch.Tensor | None, causal: bool = True):
    """FlexAttention mask_mod for causal (unless `causal` is False) + optional window + optional packed documents."""

    def mask_mod(b, h, q_idx, kv_idx):
        keep = kv_idx <= q_idx if causal else kv_idx >= 0
        if window:
            keep = keep & (q_idx - kv_idx < window)
        if segment_ids is not None:
            keep = keep & (segment_ids[b, q_idx] == segment_ids[b, kv_idx])
        return keep

    return mask_mod


class FlexAttention(nn.Module):
    """torch FlexAttention with a block mask built per call from window and segment ids.

    Compiled on accelerators (eager FlexAttention falls back to a dense reference); on CPU
    it runs eagerly and forward-only: torch 2.13 has no FlexAttention backward on CPU.
    """

    def __init__(self, compile: bool | None = None):
        super().__init__()
        self.compile = compile

    def forward(
        self, q, k, v, *, scale: float, window: int | None, segment_ids, softcap: float | None = None, causal=True
    ):
        if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise KernelUnavailable(
                "kernels.attention=flex: FlexAttention has no backward on CPU in torch 2.13, so it cannot "
                "train here; use it on CUDA, or choose attention=sdpa (or tokamax) on CPU. "
                "Forward-only use works under torch.no_grad()."
            )
        if q.device.type == "cpu":
            # FlexAttention's CPU path refuses inputs that require grad even under no_grad.
            q, k, v = q.detach(), k.detach(), v.detach()
        b, s = q.shape[0], q.shape[2]
        block_mask = create_block_mask(
            flex_mask_mod(window, segment_ids, causal),
            B=b if segment_ids is not None else None,
            H=None,
            Q_LEN=s,
            KV_LEN=s,
            device=q.device,
        )
        fn = flex_attention
        use_compile = self.compile if self.compile is not None else q.device.type != "cpu"
        if use_compile:
            fn = _compiled_flex()
        score_mod = None
        if softcap:  # flex applies `scale` first, so this caps q @ k^T * scale like the reference
            cap = float(softcap)

            def score_mod(score, b, h, q_idx, kv_idx):
                return torch.tanh(score / cap) * cap

        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])

    def extra_repr(self) -> str:
        return f"compile={self.compile}"


_COMPILED_FLEX = None


def _compiled_flex():
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX
