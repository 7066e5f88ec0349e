"""tokamax kernels as torch ops, through the JAX bridge.

Importing this module needs jax and tokamax (the `[jax]` extra). `implementation` is a
static argument: "xla" runs anywhere (the only one CPU can trace), "mosaic" selects
tokamax's Pallas kernels on TPU / recent GPUs, "auto" lets tokamax pick the best one for
the device JAX runs on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import tokamax
from absl import flags

from titan_core.kernels.jax_bridge import jax_op

# tokamax reads its settings from absl flags and, on first read, parses sys.argv as absl
# flags: our own command lines (`--kernels.attention=tokamax`, pytest's `-q`) make that
# raise UnrecognizedFlagError. Marking the flags parsed keeps tokamax's defaults.
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def _impl(implementation: str):
    return None if implementation == "auto" else implementation


@jax_op("tokamax_attention", nondiff=("segment_ids",))
def tokamax_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    *,
    scale: float,
    window: int = 0,
    causal: bool = True,
    implementation: str = "xla",
) -> jax.Array:
    """Attention (causal unless `causal` is False), q [B, S, N, D], k/v [B, S, K, D] (GQA when K < N) -> [B, S, N, D].

    window > 0 keeps keys with q - k < window; segment_ids [B, S] keep keys of the same
    packed document.
    """
    mask = None
    if segment_ids is not None:
        mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    return tokamax.dot_product_attention(
        q,
        k,
        v,
        mask=mask,
        scale=scale,
        is_causal=causal,
        # tokamax's window is (keys before, keys after) the query, the query excluded.
        local_window_size=(window - 1, 0) if window else None,
        implementation=_impl(implementation),
    )


@jax_op("tokamax_ragged_dot", nondiff=("group_sizes",))
def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, implementation: str = "xla") -> jax.Array:
    """lhs [M, K] with rows grouped (sizes group_sizes [G], summing to M) @ rhs [G, K, N] -> [M, N]."""
    return tokamax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32), implementation=_impl(implementation))


@jax_op("tokamax_linear_cross_entropy", nondiff=("labels",))
def linear_cross_entropy(
    x: jax.Array, labels: jax.Array, weight: jax.Array, *, implementation: str = "xla"
) -> jax.Array:
    """Mean cross-entropy of x [T, H] @ weight [V, H].T against labels [T] (no ignore_index, no cap).

    tokamax takes the weight as [H, V]; ours is the nn.Linear layout [V, H], transposed
    inside JAX so the torch side never copies it.
    """
    return tokamax.linear_softmax_cross_entropy_loss(
        x, labels.astype(jnp.int32), weight.T, reduction="mean", implementation=_impl(implementation)
    )
