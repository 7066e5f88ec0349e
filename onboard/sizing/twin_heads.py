"""A twin's attention heads and width (onboard/sizing/twin.py puts them into the twin's config).

    heads = twin_heads(full_args, width=None, derived=False)   # Heads(n_heads=8, n_kv_heads=2, ...)

What stays: the kind of attention (MHA stays MHA, MQA keeps its one key/value head, GQA keeps
at least MIN_KV_HEADS key/value heads) and, where HEADS_WIDTH allows it, the GQA ratio
(query heads per key/value head): Llama-3.1-8B's 32:8 becomes 8:2. With one key/value head
every query head reads the same keys, so a key/value expansion in the wrong order (`repeat`
where upstream has `repeat_interleave`) computes the same numbers and passes parity; with two
it cannot. Past HEADS_WIDTH the default twin's ratio shrinks to SHRUNK_RATIO (a --twin-width
to the largest the width holds), and the reason names the --twin-width that keeps it.

Where the config derives head_dim from hidden_size (no head_dim, or head_dim null), the width
is query heads x head_dim: a --twin-width must be one of those, and a refusal names which.
"""

from __future__ import annotations

from dataclasses import dataclass

from titan_core.models.common.args import TransformerArgs

WIDTH = 256
"""The twin's hidden_size where the config lets it be free: the debug models' width."""
MIN_KV_HEADS = 2
"""Key/value heads a GQA (or MHA) twin keeps at least, so the order of the key/value expansion shows."""
HEADS_WIDTH = 1024
"""Query heads x head_dim a default twin may spend keeping the GQA ratio with MIN_KV_HEADS key/value
heads: 8 heads of 128 (Llama-3.1-8B's 32:8 as 8:2). Attention at this width costs a 2-layer twin about
what the debug models' MLPs cost; a ratio that needs more shrinks instead (64:8 of 128 to 6:2)."""
SHRUNK_RATIO = 3
"""The default twin's GQA ratio where the full model's does not fit HEADS_WIDTH: the cheapest that still
differs from the MIN_KV_HEADS key/value heads, so an expansion by the wrong one of the two counts shows."""


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


def twin_heads(full: TransformerArgs, *, width: int | None, derived: bool) -> Heads:
    """The twin's heads for the full model's args: from `width` (the --twin-width, or None for the
    default) and whether the config derives head_dim from hidden_size (then `width` fixes the query
    heads). HeadsError for a width no split fits."""
    if derived and width is not None:
        return _heads_of_width(full, width)
    n, k, hd = full.n_heads, full.n_kv_heads, full.head_dim
    target = width if width is not None else WIDTH
    if kind(full) == "MHA":
        h = min(n, max(MIN_KV_HEADS, round(target / hd)))
        return Heads(h, h, _why(full, h, h, target))
    ratio = n // k
    kv = 1 if k == 1 else min(k, max(MIN_KV_HEADS, round(target / (ratio * hd))))
    room = max(target, HEADS_WIDTH)
    if kv * ratio * hd <= room:
        r = ratio
    elif width is None:
        r = min(ratio, SHRUNK_RATIO)
    else:  # the largest ratio the asked width holds
        r = min(ratio, max(2, room // (kv * hd)))
    return Heads(kv * r, kv, _why(full, kv * r, kv, room))


def _heads_of_width(full: TransformerArgs, width: int) -> Heads:
    """The split of width / head_dim query heads closest to the full model's ratio, keeping its kind."""
    hd = full.head_dim
    h = width // hd if width % hd == 0 else 0
    split = _split(full, h) if h else None
    if split is None:
        raise HeadsError(
            f"--twin-width {width}: this config derives head_dim = hidden_size / num_attention_heads, so the twin's "
            f"width is query heads x head_dim {hd}, split {kind(full)}-wise ({_ratio(full)}); "
            f"e.g. --twin-width {', '.join(map(str, good_widths(full)))}"
        )
    return Heads(split[0], split[1], _why(full, *split, width))


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


def good_widths(full: TransformerArgs) -> list[int]:
    """Widths a --twin-width may take where head_dim is derived: the default twin's, and the one
    keeping the GQA ratio with MIN_KV_HEADS key/value heads, where that differs."""
    default = twin_heads(full, width=None, derived=False).n_heads * full.head_dim
    keeping = min(full.n_kv_heads, MIN_KV_HEADS) * (full.n_heads // full.n_kv_heads) * full.head_dim
    return sorted({default, keeping})


def _ratio(a: TransformerArgs) -> str:
    return f"{a.n_heads}:{a.n_kv_heads}"


def _why(full: TransformerArgs, h: int, kv: int, room: int) -> str:
    """The reason of the heads' rows; `room`: the query heads x head_dim the twin had."""
    if kind(full) == "MHA":
        return f"MHA kept: {kv} heads, each its own key/value head"
    if kind(full) == "MQA":
        return "MQA kept: one key/value head" + ("" if h == full.n_heads else f", {h} query heads")
    ratio, r = full.n_heads // full.n_kv_heads, h // kv
    if r == ratio:
        return (f"GQA ratio {ratio} kept with {kv} key/value heads (with one, the order of the key/value "
                "expansion would not show)")  # fmt: skip
    keep = kv * ratio * full.head_dim
    return (f"GQA ratio {ratio} shrunk to {r} with {kv} key/value heads: keeping it takes {kv * ratio} query heads "
            f"of {full.head_dim} ({keep} wide), past the twin's {room}; --twin-width {keep} keeps it")  # fmt: skip
