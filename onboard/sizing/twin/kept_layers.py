"""Which layers of the full model a twin keeps (onboard/sizing/twin/derive.py shrinks the rest).

    n, why = pattern_layers(full_args)                  # the first layers that hold every period
    kept = select_layers(full_args, hf_config, n)        # e.g. [0, 1, 40]: layer 40 is the first sliding one
    rows = select_lists(hf_config, twin_config, kept)    # layer_types, mlp_only_layers, ... rewritten

The twin starts with the full model's first layers: the leading dense layers of an MoE model
and one full period of every periodic pattern the args express (sliding/full every g-th layer,
RoPE skipped every k-th, MoE every k-th). A kind of layer those miss (a pattern that is not
periodic: sliding layers listed one by one in `layer_types`, a dense layer deep in
`mlp_only_layers`) is then added: the first layer of that kind, preceded by as many of the
layers before it as it takes to keep every period in step (none when nothing is periodic), so
layer p of the twin is always one layer of the full model with the same kind. A layer's kind
is read from the args (MoE, rotates q and k, attends globally) and from the config's own
per-layer lists, which the args of a non-periodic pattern cannot express (the transformers
path's args count such a model's every layer as global).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from titan_core.models.common.args import TransformerArgs

from onboard.sizing.shrink import entries_of, first_of_each_kind, renumbered

MIN_LAYERS = 2
"""The fewest layers a twin has: a layer's output feeding another layer is part of what parity checks."""
PER_LAYER_LISTS = ("layer_types", "no_rope_layers")
"""Config lists of one entry per layer: the twin holds the kept layers' entries."""
LAYER_INDEX_LISTS = ("mlp_only_layers",)
"""Config lists of layer indices: the twin holds the kept layers' new indices."""


def layer_kind(a: TransformerArgs, i: int) -> tuple[bool, bool, bool]:
    """(MoE, rotates q and k, attends globally) of layer i as the args say: what the twin must reproduce."""
    return a.layer_is_moe(i), a.layer_uses_rope(i), a.layer_window(i) is None


def _periods(a: TransformerArgs) -> list[tuple[str, int]]:
    periods = []
    if a.sliding_window and a.global_every:
        periods.append(("sliding/full", a.global_every))
    if a.rope_skip_every:
        periods.append(("RoPE skip", a.rope_skip_every))
    if a.n_experts and a.moe_every > 1:
        periods.append(("MoE", a.moe_every))
    return periods


def pattern_period(a: TransformerArgs) -> int:
    """The period every periodic pattern of the args repeats with (1: nothing periodic)."""
    return math.lcm(*(p for _, p in _periods(a))) if _periods(a) else 1


def pattern_layers(a: TransformerArgs) -> tuple[int, str]:
    """(fewest first layers holding the pattern, why): the leading dense layers of an MoE model and
    one full period of the periodic patterns, at least MIN_LAYERS. Kinds these miss are added by
    `select_layers`."""
    prefix = 0
    while a.n_experts and prefix < a.n_layers and not a.layer_is_moe(prefix):
        prefix += 1
    if prefix == a.n_layers:
        prefix = 0  # no MoE layer at all: nothing leads
    n = min(a.n_layers, max(MIN_LAYERS, prefix + pattern_period(a)))
    parts = [f"{name} every {p}" for name, p in _periods(a)] or ["every layer alike"]
    if prefix:
        parts.insert(0, f"{prefix} dense layer(s) first")
    return n, "one full period of the layer pattern (" + ", ".join(parts) + f"), at least {MIN_LAYERS}"


def _entry(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, list) and i < len(value) else None


def config_kind(cfg: dict[str, Any], i: int) -> tuple:
    """What the config's per-layer lists say of layer i (its layer_types and no_rope_layers entries,
    whether mlp_only_layers names it)."""
    listed = tuple(_entry(cfg.get(key), i) for key in PER_LAYER_LISTS)
    named = tuple(isinstance(cfg.get(key), list) and i in cfg[key] for key in LAYER_INDEX_LISTS)
    return listed + named


def layer_kinds(a: TransformerArgs, cfg: dict[str, Any]) -> list[tuple]:
    """The kind of every layer of the model `cfg` describes (read as `a`): the args' and the lists'."""
    return [layer_kind(a, i) + config_kind(cfg, i) for i in range(a.n_layers)]


def select_layers(a: TransformerArgs, cfg: dict[str, Any], n: int) -> list[int]:
    """The full model's layers the twin keeps, in order: the first `n`, then for each kind they miss
    the first layer of that kind, after the layers before it that keep the periods in step."""
    return first_of_each_kind(layer_kinds(a, cfg), range(n), pattern_period(a))


def select_lists(cfg: dict[str, Any], twin: dict[str, Any], kept: list[int]) -> list[tuple[str, Any, Any, str]]:
    """Write into `twin` the per-layer lists of `cfg` for the `kept` layers; the rows (key, full, twin, why)."""
    rows = []
    contiguous = kept == list(range(len(kept)))
    why = f"the first {len(kept)} layers' entries" if contiguous else f"the entries of layers {_layers(kept)}"
    for key in PER_LAYER_LISTS + LAYER_INDEX_LISTS:
        value = cfg.get(key)
        if not isinstance(value, list):
            continue
        cut = renumbered(value, kept) if key in LAYER_INDEX_LISTS else entries_of(value, kept)
        if cut != value:
            twin[key] = cut
            rows.append((key, brief(value), brief(cut), why))
    return rows


def _layers(kept: list[int]) -> str:
    return ", ".join(map(str, kept)) if len(kept) <= 8 else f"{kept[0]}-{kept[len(kept) // 2]}, ..., {kept[-1]}"


def describe_layers(kept: list[int], n: int) -> str | None:
    """Why layers past the first `n` were kept (None when none were)."""
    extra = kept[n:]
    if not extra:
        return None
    return f"layers {_layers(extra)} added: the first of each kind of layer the first {n} do not hold"


def kinds_label(a: TransformerArgs, cfg: dict[str, Any]) -> str:
    """The kinds of layer a model holds, counted: e.g. "full_attention x43, sliding_attention x5"."""
    labels = Counter(_label(a, cfg, i) for i in range(a.n_layers))
    return ", ".join(f"{label} x{count}" for label, count in sorted(labels.items()))


def _label(a: TransformerArgs, cfg: dict[str, Any], i: int) -> str:
    moe, rope, full = layer_kind(a, i)
    parts = [str(_entry(cfg.get("layer_types"), i) or ("" if not a.sliding_window else "full" if full else "sliding"))]
    if a.n_experts:
        parts.append("MoE" if moe else "dense")
    if not rope or _entry(cfg.get("no_rope_layers"), i) == 0:
        parts.append("no RoPE")
    return "/".join(p for p in parts if p) or "alike"


def brief(v: list) -> str:
    """A per-layer list for a table cell: whole when short, else its length and distinct entries."""
    if len(v) <= 6:
        return str(v)
    distinct = sorted({str(x) for x in v})
    return f"{len(v)} entries ({', '.join(distinct[:3])}{', ...' if len(distinct) > 3 else ''})"
