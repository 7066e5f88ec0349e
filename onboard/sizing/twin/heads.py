"""A twin's attention heads and width (onboard/sizing/twin/derive.py puts them into the twin's config).

    heads = twin_heads(full_args, width=None, derives=False)   # Heads(n_heads=16, n_kv_heads=2, ...)

What stays: the kind of attention (MHA stays MHA, MQA keeps its one key/value head, GQA keeps
MIN_KV_HEADS key/value heads), head_dim, and the GQA ratio (query heads per key/value head):
the query heads are MIN_KV_HEADS x the ratio, Llama-3.1-8B's 32:8 becomes 8:2, Llama-3.1-70B's
64:8 16:2, Qwen3-235B-A22B's 64:4 32:2 (an MQA twin keeps all its query heads on its one
key/value head). The kernels and the memory the ladder proves on the twin are then those of the
full model's head layout: the same key/value expansion groups, the same head_dim. With one
key/value head every query head reads the same keys, so a key/value expansion in the wrong order
(`repeat` where upstream has `repeat_interleave`) computes the same numbers and passes parity;
with two it cannot. An MHA twin keeps WIDTH / head_dim heads (at least MIN_KV_HEADS).

The heads do not set the width. Where the config holds head_dim apart from hidden_size (an
explicit head_dim, or one twin.py writes into the twin where the full config derives it and the
family and its upstream class read an explicit one: Llama, Mistral, Mixtral), hidden_size is
WIDTH (or the --twin-width), a multiple of MULTIPLE, so twins of every family are equally wide.
Only where the family derives head_dim = hidden_size / query heads whatever the config says
(`derives`) is the width query heads x head_dim: the default twin takes the narrowest that keeps
the ratio; a --twin-width fixes the query heads (width / head_dim), split closest to the ratio,
and must be one of those widths (a refusal names which). A ratio such a width cannot hold
shrinks: the GQA row says so and names the --twin-width that keeps it, and parity counts the
ratio as a feature the twin does not hold (onboard/parity/features.py `not_held`: gqa_ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

from titan_core.models.common.args import TransformerArgs

WIDTH = 256
"""The twin's hidden_size where the config lets it be free: the debug models' width."""
MULTIPLE = 16
"""Every width a twin chooses (hidden_size, the dense, expert and shared-expert intermediate sizes) is a
multiple of this: float8's scaled matmul (torch._scaled_mm, the float8 lever of the kernels and tuning
rungs) needs both dimensions of each matmul divisible by 16, and the rungs run the twin in the recipe's
precision. A --twin-width that is not a multiple is refused."""
MIN_KV_HEADS = 2
"""Key/value heads a GQA (or MHA) twin keeps at least, so the order of the key/value expansion shows."""


class HeadsError(ValueError):
    """A --twin-width no split of the heads fits (the message names widths that do)."""


@dataclass(frozen=True)
class Heads:
    n_heads: int
    """Query heads of the twin."""
    n_kv_heads: int
    """Key/value heads of the twin."""
    why: str
    """The GQA-ratio row's reason: kept, or shrunk and why."""


def kind(a: TransformerArgs) -> str:
    """MHA, MQA or GQA: what a twin keeps of the head layout."""
    return "MHA" if a.n_kv_heads == a.n_heads else "MQA" if a.n_kv_heads == 1 else "GQA"


def ratio(a: TransformerArgs) -> int:
    """Query heads per key/value head."""
    return a.n_heads // a.n_kv_heads


def twin_heads(full: TransformerArgs, *, width: int | None, derives: bool) -> Heads:
    """The twin's heads for the full model's args: `width` (the --twin-width, or None for the default)
    and whether the family derives head_dim from hidden_size whatever the config says (`derives`: then
    a `width` fixes the query heads). HeadsError for a width no split fits."""
    if derives and width is not None:
        return _heads_of_width(full, width)
    h, kv = _default(full)
    return Heads(h, kv, _why(full, h, kv))


def _default(full: TransformerArgs) -> tuple[int, int]:
    """(query heads, key/value heads) of the default twin: the ratio with MIN_KV_HEADS key/value heads."""
    n, k = full.n_heads, full.n_kv_heads
    if kind(full) == "MHA":
        h = min(n, max(MIN_KV_HEADS, round(WIDTH / full.head_dim)))
        return h, h
    kv = 1 if k == 1 else min(k, MIN_KV_HEADS)
    return kv * ratio(full), kv


def _heads_of_width(full: TransformerArgs, width: int) -> Heads:
    """The split of width / head_dim query heads closest to the full model's ratio, keeping its kind."""
    hd = full.head_dim
    h = width // hd if width % hd == 0 else 0
    split = _split(full, h) if h else None
    if split is None:
        raise HeadsError(
            f"--twin-width {width}: this model derives head_dim = hidden_size / num_attention_heads, so the twin's "
            f"width is query heads x head_dim {hd}, split {kind(full)}-wise ({_ratio(full)}); "
            f"e.g. --twin-width {', '.join(map(str, good_widths(full, width)))}"
        )
    return Heads(split[0], split[1], _why(full, *split))


def _split(full: TransformerArgs, h: int) -> tuple[int, int] | None:
    """(query heads, key/value heads) for `h` query heads, or None when no split keeps the kind."""
    n, k = full.n_heads, full.n_kv_heads
    if not min(n, MIN_KV_HEADS) <= h <= n:
        return None
    if kind(full) == "MHA":
        return h, h
    if kind(full) == "MQA":
        return h, 1
    for r in range(min(n // k, h // MIN_KV_HEADS), 1, -1):  # the ratio first, then the next below it
        if h % r == 0 and MIN_KV_HEADS <= h // r <= k:
            return h, h // r
    return None


def good_widths(full: TransformerArgs, width: int | None = None) -> list[int]:
    """Widths a --twin-width may take where head_dim is derived whatever the config says: the one
    keeping the GQA ratio (the default twin's), and the widest split below `width`, where that differs."""
    hd = full.head_dim
    keeping = _default(full)[0] * hd
    below = [h * hd for h in range(1, full.n_heads + 1) if h * hd < (width or 0) and _split(full, h)]
    return sorted({keeping, *below[-1:]})


def _ratio(a: TransformerArgs) -> str:
    return f"{a.n_heads}:{a.n_kv_heads}"


def _why(full: TransformerArgs, h: int, kv: int) -> str:
    """The reason of the heads' rows."""
    if kind(full) == "MHA":
        return f"MHA kept: {kv} heads, each its own key/value head"
    full_ratio, r = ratio(full), h // kv
    if kind(full) == "MQA":
        if r == full_ratio:
            return f"MQA kept: one key/value head, its {h} query heads (the ratio {full_ratio})"
        return f"MQA kept: one key/value head; ratio {full_ratio} shrunk to {r}: {_keeps(full, kv)}"
    if r == full_ratio:
        return (f"GQA ratio {full_ratio} kept with {kv} key/value heads (with one, the order of the key/value "
                "expansion would not show)")  # fmt: skip
    return f"GQA ratio {full_ratio} shrunk to {r} with {kv} key/value heads: {_keeps(full, kv)}"


def _keeps(full: TransformerArgs, kv: int) -> str:
    """What keeps the ratio where a width derived from the heads lost it."""
    keep = kv * ratio(full) * full.head_dim
    return (f"this model derives head_dim from hidden_size, so keeping it takes {kv * ratio(full)} query heads of "
            f"{full.head_dim}, {keep} wide; --twin-width {keep} keeps it")  # fmt: skip
