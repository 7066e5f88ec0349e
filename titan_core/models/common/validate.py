"""Structural rules on model args: the shapes a decoder can be built from at all.

A size of zero, a fraction, heads that do not divide the width or key/value heads that do
not divide the heads fail much later and far from the cause (a ZeroDivisionError in the
args, a shape error in the first forward, a refusal inside transformers at parity). These
rules refuse them where the args are made: `HFAdapter.args_from_hf` checks a config's
values under their HF names, `apply_model_overrides` checks every resolved TransformerArgs
(the trainer's path, so a recipe edited by hand is refused too).

The rules, on native field names (the message uses the name the user wrote):
- sizes are integers (JSON `true` is not one) >= 1: dim, n_layers, n_heads, n_kv_heads,
  head_dim, vocab_size, ffn_hidden_dim, max_seq_len, moe_every; >= 0: n_experts,
  moe_hidden_dim, shared_expert_hidden_dim, global_every, rope_skip_every; a
  sliding_window is null or >= 1; dense_layers are integers >= 0;
- n_kv_heads divides n_heads (each key/value head serves an equal group of query heads);
- without an explicit head_dim (derived as dim // n_heads), n_heads divides dim; some
  upstream classes (LlamaConfig) demand it even with one (`width_free=False`);
- head_dim is even when any layer uses RoPE (it rotates channel pairs, half-split);
- with experts: 1 <= top_k <= n_experts and moe_hidden_dim >= 1;
- norm_eps is a finite number >= 0, rope_theta a finite number > 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, fields
from typing import Any, Mapping

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.mapping_errors import AdapterError, ArchitectureError

POSITIVE = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_hidden_dim", "max_seq_len",
            "moe_every")  # fmt: skip
NON_NEGATIVE = ("n_experts", "moe_hidden_dim", "shared_expert_hidden_dim", "global_every", "rope_skip_every")
DEFAULTS = {f.name: f.default for f in fields(TransformerArgs) if f.default is not MISSING}


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _show(v: Any) -> str:
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def check_args(values: Mapping[str, Any], *, names: Mapping[str, str] | None = None, width_free: bool = True) -> None:
    """Raise ArchitectureError for the first rule `values` break (see the module docstring);
    a plain AdapterError where a list or a text stands for a number (another config layout).

    `values` maps native fields to values; one absent or None takes its TransformerArgs
    default (n_kv_heads None: n_heads; head_dim None: dim // n_heads, which then needs
    n_heads to divide dim). `names` maps a native field to what the user called it (an HF
    key, `model.overrides.x`) for the message. Only the fields present are checked for
    their own rule, so a partial set (the sizes, before a family reads the rest) can be
    checked first.
    """
    names = names or {}
    given = {k: v for k, v in values.items() if v is not None}

    def name(f: str) -> str:
        return names.get(f, f)

    def fail(rule: str, *at: str) -> None:
        first = at[0]
        shown = _show(given[first]) if first in given else f"{_show(DEFAULTS.get(first))} (the default)"
        message = f"{name(first)} = {shown}: {rule}"
        if first in given and not isinstance(given[first], (int, float)):
            # a list or a text where a number is meant: another layout of config (per-layer
            # sizes), which a port may implement; an AdapterError, not a structural one
            raise AdapterError(message + " (this family reads one number here)")
        raise ArchitectureError(message, at)

    for f in POSITIVE:
        if f in given and not (is_int(given[f]) and given[f] >= 1):
            fail("must be a positive integer", f)
    for f in NON_NEGATIVE:
        if f in given and not (is_int(given[f]) and given[f] >= 0):
            fail("must be an integer >= 0", f)
    if "sliding_window" in given and not (is_int(given["sliding_window"]) and given["sliding_window"] >= 1):
        fail("must be a positive integer (tokens in the window) or null for no window", "sliding_window")
    dense = given.get("dense_layers", [])
    if not isinstance(dense, (list, tuple)):
        raise AdapterError(f"{name('dense_layers')} = {_show(dense)}: must be a list of layer indices")
    if not all(is_int(i) and i >= 0 for i in dense):
        rule = "must list layer indices (integers >= 0)"
        raise ArchitectureError(f"{name('dense_layers')} = {_show(dense)}: {rule}", ("dense_layers",))
    for f, zero_ok in (("norm_eps", True), ("rope_theta", False)):
        v = given.get(f)
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if v is not None and not (number and (v >= 0 if zero_ok else v > 0)):
            fail("must be a finite number " + (">= 0" if zero_ok else "> 0"), f)

    n_heads = given.get("n_heads")
    if n_heads is None:
        return  # the head rules need the head count; a partial check without it ends here
    kv = given.get("n_kv_heads", n_heads)
    if n_heads % kv:
        fail(
            f"must be a multiple of {name('n_kv_heads')} = {kv} (each key/value head serves an equal group "
            "of query heads)",
            "n_heads",
            "n_kv_heads",
        )
    dim, head_dim = given.get("dim"), given.get("head_dim")
    if dim is not None and dim % n_heads and (head_dim is None or not width_free):
        unless = (
            "unless head_dim is given" if width_free else "(its upstream config class requires it, head_dim or not)"
        )
        fail(f"must be a multiple of {name('n_heads')} = {n_heads} {unless}", "dim", "n_heads")
    no_rope_anywhere = given.get("rope_skip_every", 0) == 1
    if dim is not None and not no_rope_anywhere:
        rule = "must be even (RoPE rotates pairs of channels)"
        if head_dim is not None and head_dim % 2:
            fail(rule, "head_dim")
        if head_dim is None and (dim // n_heads) % 2:
            derived = f"{name('dim')} // {name('n_heads')} = {dim // n_heads}"
            raise ArchitectureError(f"head_dim {derived}: {rule}", ("dim", "n_heads"))
    n_experts = given.get("n_experts", 0)
    if n_experts:
        top_k = given.get("top_k", DEFAULTS["top_k"])
        if not (is_int(top_k) and top_k >= 1):
            fail("must be a positive integer", "top_k")
        if top_k > n_experts:
            fail(
                f"must be at most {name('n_experts')} = {n_experts} (each token picks that many distinct experts)",
                "top_k",
                "n_experts",
            )
        if given.get("moe_hidden_dim", DEFAULTS["moe_hidden_dim"]) < 1:
            fail("must be a positive integer when there are experts", "moe_hidden_dim")


def validate_args(args: TransformerArgs, *, names: Mapping[str, str] | None = None) -> None:
    """`check_args` on resolved args. head_dim is always filled in by then, so the width
    rule (n_heads divides dim) is left to the config reading, which knows whether it was given."""
    check_args({f.name: getattr(args, f.name) for f in fields(args)}, names=names)
