"""Splash attention (the TPU Pallas kernel shipped with JAX) as a torch op.

On TPU it runs through TorchTPU (`torch.tpu.pallas.jax_op`, see jax_bridge). Anywhere else
it only runs in Pallas interpret mode (`interpret=True`), which is slow but executes the
same kernel code on CPU: that is how the tests check its numerics without a TPU.

Shapes follow the model's attention core: q [B, N, S, D], k/v [B, K, S, D]. GQA runs the
multi-query kernel once per KV head over its group of N/K query heads. Sequences are padded
up to a multiple of the block size: padded keys sit after every real query, so the causal
mask already hides them, and padded queries are sliced off (their gradient is zero).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

from titan_core.kernels.jax_bridge import jax_op

_LANES = 128  # TPU vector lane width: splash blocks are multiples of it


def _block(seq: int) -> int:
    """Largest of 512/256/128 dividing the padded sequence (bigger blocks amortise better)."""
    return next(b for b in (512, 256, _LANES) if seq % b == 0)


@jax_op("splash_attention", nondiff=("segment_ids",))
def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    *,
    scale: float,
    window: int = 0,
    interpret: bool = False,
) -> jax.Array:
    """Causal (optionally windowed, optionally packed) GQA attention with the splash kernel."""
    b, n, s, d = q.shape
    kv_heads = k.shape[1]
    group = n // kv_heads
    padded = -(-s // _LANES) * _LANES
    if padded != s:
        pad = [(0, 0), (0, 0), (0, padded - s), (0, 0)]
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
        if segment_ids is not None:
            # Any id works for the padding: real queries never see those keys (causal).
            segment_ids = jnp.pad(segment_ids, [(0, 0), (0, padded - s)], constant_values=-1)
    shape = (padded, padded)
    head_mask = sm.LocalMask(shape, (window - 1, 0), 0) if window else sm.CausalMask(shape)
    blk = _block(padded)
    sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_q_dkv=blk, block_kv_dkv=blk, block_q_dq=blk, block_kv_dq=blk)
    kernel = sk.make_splash_mqa_single_device(
        sm.MultiHeadMask([head_mask] * group), block_sizes=sizes, interpret=interpret
    )
    # splash takes no scale argument: scaling q first is the same softmax(q k^T * scale).
    qg = (q * jnp.asarray(scale, q.dtype)).reshape(b, kv_heads, group, padded, d)

    def per_kv_head(qh, kh, vh, seg):
        ids = None if seg is None else sk.SegmentIds(q=seg, kv=seg)
        return kernel(qh, kh, vh, segment_ids=ids)

    def per_batch(qb, kb, vb, seg):
        return jax.vmap(lambda qh, kh, vh: per_kv_head(qh, kh, vh, seg))(qb, kb, vb)

    if segment_ids is None:
        out = jax.vmap(lambda qb, kb, vb: per_batch(qb, kb, vb, None))(qg, k, v)
    else:
        out = jax.vmap(per_batch)(qg, k, v, segment_ids.astype(jnp.int32))
    return out.reshape(b, n, padded, d)[:, :, :s]
