"""The rules a twin and a compat tiny config share when they shrink a real config.

    shrunk(4096, 256)                           # 256; shrunk(128, 256) stays 128, shrunk(None, 256) None
    first_of_each_kind(kinds, range(2), 2)      # the first 2 layers, then the first of each kind they miss
    entries_of(layer_types, kept)               # a per-layer list cut to the kept layers
    moved_token_ids(cfg, move)                  # {"eos_token_id": ...}: the ids `move` changes

A twin (onboard/sizing/twin/derive.py) keeps the full model's structure at a debug model's size: its head
layout and head_dim, its layer pattern's periods, its sizes scaled with the width. A tiny config
(onboard/compat/tiny.py) is the smallest a transformers config class builds, set through the class's
own arguments. They differ in how small, and share:

- which keys carry a size: the HF-name table (titan_core/models/common/hf_keys.py), a size written
  under the name the config uses, so the class reads the new value and there is no second key;
- a size only shrinks (`shrinks`): a value already at or below the small one stays, so does a count of
  0 or one key/value head (no structure removed) and a None, unless the class derives it (no feature added);
- the layers kept (`first_of_each_kind`): the first ones asked for, then the first layer of each kind
  they miss, after the layers before it that keep every period of the pattern in step; per-layer lists
  keep the kept layers' entries (`entries_of`), lists of layer indices are renumbered (`renumbered`);
- token ids past the small vocabulary are moved into it (`moved_token_ids`), each by its caller's rule
  (a twin keeps an id's distance from the vocabulary's end; a tiny config takes its last id).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Mapping, Sequence
from typing import Any


def shrinks(value: Any, small: int, derived: bool = False) -> bool:
    """Whether `small` replaces `value`: only a larger integer does (not a bool), or a None where the
    class derives the size (`derived`: head_dim from the width, key/value heads from the heads)."""
    if value is None:
        return derived
    return isinstance(value, int) and not isinstance(value, bool) and value > small


def shrunk(value: Any, small: int) -> Any:
    """`small` where it `shrinks` `value`, else `value` as it is."""
    return small if shrinks(value, small) else value


def first_of_each_kind(kinds: Sequence[Hashable], first: Sequence[int] = (), period: int = 1) -> list[int]:
    """The layers kept, in order: `first` (the first layers, 0 to n - 1), then for each kind of layer
    (`kinds[i]`: layer i's) they miss, the first layer of that kind, preceded by as many of the layers
    before it as put it where it sits in every `period` (kept layer p is layer j with p = j mod period)."""
    kept = list(first)
    have = {kinds[i] for i in kept}
    for j in range(len(kept), len(kinds)):
        if kinds[j] in have:
            continue
        start = j - (j - len(kept)) % period
        kept += range(start, j + 1)
        have |= {kinds[i] for i in range(start, j + 1)}
    return kept


def entries_of(values: Sequence[Any], kept: Sequence[int]) -> list[Any]:
    """A per-layer list (one entry per layer) cut to the `kept` layers' entries, in their order."""
    return [values[i] for i in kept if i < len(values)]


def renumbered(layers: Container[int], kept: Sequence[int]) -> list[int]:
    """The new indices of the kept layers that `layers` (old indices) names: kept layer p is old kept[p]."""
    return [p for p, i in enumerate(kept) if i in layers]


def moved_token_ids(cfg: Mapping[str, Any], move: Callable[[Any], Any]) -> dict[str, Any]:
    """{key: ids} of the `*_token_id` entries of `cfg` (one id or a list of them) that `move`, applied
    to each id, changes."""
    out = {}
    for key, value in cfg.items():
        if not key.endswith("_token_id"):
            continue
        moved = [move(t) for t in value] if isinstance(value, list) else move(value)
        if moved != value:
            out[key] = moved
    return out
