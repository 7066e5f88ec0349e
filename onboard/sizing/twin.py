"""A twin: a small config with the structure of a real-size one, for checking runs on a small machine.

    twin = derive_twin(hf_config, adapter)              # Twin(config=..., rows=[...])
    twin = derive_twin(hf_config, adapter, layers=4, width=512, experts=16)

The twin is the HF config dict itself with the sizes shrunk, so the same model_type, the
same upstream class and the same adapter read it, and every key that is not a size stays
as written: head_dim, the GQA ratio (query heads per key/value head), QK-norm, biases, the
RoPE type, theta and scaling, the norm epsilon, soft-caps, tied embeddings, MoE top-k, the
router's normalisation, the load-balancing coefficient, the expert layout.

What shrinks, and to what (the debug models' cost, so eager and parity run in seconds on
a CPU):
- layers: the fewest that hold one full period of the layer pattern (sliding/full
  alternation, RoPE-skip layers, MoE every k-th layer) after the leading dense layers, and
  every kind of layer the full model has; at least MIN_LAYERS;
- heads: one key/value head (more only to reach the width), query heads = the GQA ratio;
- hidden_size: WIDTH, or query heads x head_dim where the config derives head_dim from it
  (no explicit head_dim) and a multiple of the query heads where its class demands that;
- intermediate sizes (dense, expert, shared expert): scaled with hidden_size;
- vocab_size: VOCAB (token ids past it are moved to the same distance from its end);
- a sliding window longer than WINDOW: WINDOW, so a short run's sequence crosses it;
- experts: at most max(EXPERTS, 2 x top-k) (or `experts`), top-k kept and below the count;
- per-layer lists (layer_types, mlp_only_layers, no_rope_layers): their first `layers` entries.

The result is checked by reading it back through the adapter: the structural fields must
equal the full model's and the twin's layers must be the full model's first layers, kind
for kind; anything else is a TwinError naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from titan_core.models.common.args import TransformerArgs
from titan_core.models.flux.config import flux_of_args

from onboard.sizing.flux_twin import derive_flux_twin

MIN_LAYERS = 2
WIDTH = 256
VOCAB = 2048
WINDOW = 64
"""The debug models' shapes (titan_core/models/*/flavors.py): dim 256, vocab 2048, window 64."""
MULTIPLE = 16
"""Intermediate widths are rounded to a multiple of this (matmul-friendly, never below it)."""
EXPERTS = 16
"""At most max(EXPERTS, 2 x top-k) experts: the reference expert loop (and HF's) runs a handful of
small ops per expert, so 128 experts make a training step take seconds on a busy 2-core CPU, while
twice top-k keeps the routing a real choice (half the experts idle for each token)."""

KEPT = ("head_dim", "qk_norm", "qkv_bias", "out_bias", "rope_theta", "rope_scaling", "rope_skip_every", "norm_eps",
        "final_softcap", "tie_embeddings", "global_every", "top_k", "norm_topk_prob", "moe_every", "aux_loss_coef",
        "max_seq_len")  # fmt: skip
"""Native fields the twin must read back exactly as the full model has them."""

# native field -> the HF key a config writes it under when the adapter's hf_names does not say
HF_KEYS = {
    "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "vocab_size": "vocab_size",
    "ffn_hidden_dim": "intermediate_size", "sliding_window": "sliding_window", "n_experts": "num_experts",
    "moe_hidden_dim": "moe_intermediate_size", "shared_expert_hidden_dim": "shared_expert_intermediate_size",
}  # fmt: skip
PER_LAYER_LISTS = ("layer_types", "mlp_only_layers", "no_rope_layers")
"""Lists of one entry per layer (or of layer indices, mlp_only_layers) cut to the twin's layers."""


class TwinError(ValueError):
    """No faithful twin: a knob out of range, or a config the adapter reads back differently."""


@dataclass(frozen=True)
class TwinRow:
    field: str
    """The HF key (or a derived feature such as the GQA ratio)."""
    full: Any
    twin: Any
    why: str


@dataclass
class Twin:
    config: dict[str, Any]
    """The twin's HF config (what twin.json holds)."""
    rows: list[TwinRow] = field(default_factory=list)
    """What shrank and what was kept, one row each."""
    full_args: TransformerArgs | None = None
    args: TransformerArgs | None = None

    def table(self) -> str:
        """The rows as an aligned text table: field, full, twin, why."""
        cells = [("field", "full", "twin", "why")] + [(r.field, _show(r.full), _show(r.twin), r.why) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3] for c in cells)

    def rows_json(self) -> list[dict[str, Any]]:
        return [{"field": r.field, "full": r.full, "twin": r.twin, "why": r.why} for r in self.rows]

    def summary(self) -> str:
        """One line: the twin's shape beside the full model's."""
        return f"twin: {describe_args(self.args)} (full model: {describe_args(self.full_args)})"


def describe_args(a: TransformerArgs | None) -> str:
    if a is None:
        return "?"
    moe = f", {a.n_experts} experts top-{a.top_k}" if a.n_experts else ""
    heads = f"{a.n_heads}/{a.n_kv_heads} heads of {a.head_dim}"
    return f"{a.n_layers} layers, hidden {a.dim}, {heads}, vocab {a.vocab_size}{moe}"


def _show(v: Any) -> str:
    return "-" if v is None else str(v)


def layer_kind(a: TransformerArgs, i: int) -> tuple[bool, bool, bool]:
    """(MoE, rotates q and k, attends globally) of layer i: what the twin must reproduce."""
    return a.layer_is_moe(i), a.layer_uses_rope(i), a.layer_window(i) is None


def pattern_layers(a: TransformerArgs) -> tuple[int, str]:
    """(fewest layers holding the pattern, why): the leading dense layers of an MoE model, one
    full period of the periodic patterns, and at least one layer of every kind the model has."""
    periods = []
    if a.sliding_window and a.global_every:
        periods.append(("sliding/full", a.global_every))
    if a.rope_skip_every:
        periods.append(("RoPE skip", a.rope_skip_every))
    if a.n_experts and a.moe_every > 1:
        periods.append(("MoE", a.moe_every))
    period = math.lcm(*(p for _, p in periods)) if periods else 1
    prefix = 0
    while a.n_experts and prefix < a.n_layers and not a.layer_is_moe(prefix):
        prefix += 1
    if prefix == a.n_layers:
        prefix = 0  # no MoE layer at all: nothing leads
    n = min(a.n_layers, max(MIN_LAYERS, prefix + period))
    kinds = {layer_kind(a, i) for i in range(a.n_layers)}
    while n < a.n_layers and {layer_kind(a, i) for i in range(n)} != kinds:
        n += 1
    parts = [f"{name} every {p}" for name, p in periods] or ["every layer alike"]
    if prefix:
        parts.insert(0, f"{prefix} dense layer(s) first")
    return n, "one full period of the layer pattern (" + ", ".join(parts) + f"), at least {MIN_LAYERS}"


def _round(x: float, multiple: int = MULTIPLE) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def derive_twin(
    cfg: dict[str, Any],
    adapter: Any,
    *,
    layers: int | None = None,
    width: int | None = None,
    experts: int | None = None,
) -> Twin:
    """The twin of the HF config `cfg` as `adapter` (a family's HFAdapter or a workspace's)
    reads it; `layers`, `width` (hidden_size) and `experts` override the choices. TwinError
    for a knob out of range or a twin the adapter reads back unfaithfully."""
    full, _ = adapter.args_from_hf(cfg)
    if flux_of_args(full) is not None:
        if experts is not None:
            raise TwinError("a FLUX model has no experts to halve")
        try:
            config, flux_rows = derive_flux_twin(cfg, adapter, layers=layers, width=width)
        except ValueError as e:
            raise TwinError(str(e)) from None
        return Twin(config=config, rows=[TwinRow(*r) for r in flux_rows], full_args=full,
                    args=adapter.args_from_hf(config)[0])  # fmt: skip
    names = {**HF_KEYS, **_hf_names(adapter, cfg)}
    rows: list[TwinRow] = []
    twin = dict(cfg)

    def put(native: str, value: Any, why: str) -> None:
        key = names[native]
        old = cfg.get(key, getattr(full, native, None))
        if key in cfg or value != old:
            twin[key] = value
        if value != old:
            rows.append(TwinRow(key, old, value, why))

    # layers
    least, why_layers = pattern_layers(full)
    n = least if layers is None else layers
    if layers is not None and not least <= layers <= full.n_layers:
        raise TwinError(
            f"--twin-layers {layers}: must be between {least} ({why_layers}) and the model's {full.n_layers}"
        )
    put("n_layers", n, why_layers if layers is None else "--twin-layers")
    _cut_lists(cfg, twin, n, full.n_layers, rows)

    # heads and width
    ratio = full.n_heads // full.n_kv_heads
    hd = full.head_dim
    derived_head_dim = names["head_dim"] not in cfg  # the class computes it as hidden_size // heads
    width_free = bool(getattr(adapter, "width_free", lambda c: True)(cfg)) and not derived_head_dim
    target = width if width is not None else WIDTH
    if target < 1:
        raise TwinError(f"--twin-width {width}: must be a positive integer")
    kv = min(full.n_kv_heads, max(1, round(target / (ratio * hd))))
    heads = kv * ratio
    if derived_head_dim:
        dim = heads * hd
        if width is not None and width != dim:
            raise TwinError(
                f"--twin-width {width}: {cfg.get('model_type')} derives head_dim = hidden_size / num_attention_heads, "
                f"so keeping head_dim {hd} and the GQA ratio {ratio} makes the width a multiple of {ratio * hd} "
                f"(e.g. {dim})"
            )
        why_dim = f"query heads x head_dim ({heads} x {hd}): the config derives head_dim from it"
    elif width_free:
        dim = target
        why_dim = "--twin-width" if width is not None else f"the debug models' width ({WIDTH})"
    else:
        dim = -(-target // heads) * heads
        why_dim = f"a multiple of the {heads} query heads, which this config class requires"
    if dim > full.dim:
        dim, heads, kv, why_dim = full.dim, full.n_heads, full.n_kv_heads, "the full model is no wider"
    put("n_heads", heads, f"GQA ratio {ratio} kept with {kv} key/value head(s)")
    put("n_kv_heads", kv, f"the fewest that keep the GQA ratio {ratio} at this width")
    put("dim", dim, why_dim)
    scale = dim / full.dim
    put(
        "ffn_hidden_dim",
        min(full.ffn_hidden_dim, _round(full.ffn_hidden_dim * scale)),
        f"scaled with hidden_size ({full.dim} -> {dim})",
    )
    if full.n_experts:
        put("moe_hidden_dim", min(full.moe_hidden_dim, _round(full.moe_hidden_dim * scale)), "scaled with hidden_size")
        n_exp = min(full.n_experts, max(EXPERTS, 2 * full.top_k)) if experts is None else experts
        if not full.top_k < n_exp <= full.n_experts:
            raise TwinError(
                f"twin experts {experts}: must be above top-k ({full.top_k}) and at most the model's {full.n_experts}"
            )
        why = (
            f"at most max({EXPERTS}, 2 x top-k): one loop step per expert keeps short CPU runs fast; top-k "
            f"{full.top_k} stays below it"
        )
        put("n_experts", n_exp, "fewer experts so the twin fits the budget" if experts is not None else why)
    if full.shared_expert_hidden_dim:
        put("shared_expert_hidden_dim", _round(full.shared_expert_hidden_dim * scale), "scaled with hidden_size")

    # vocabulary, window, token ids
    vocab = min(full.vocab_size, VOCAB)
    tied = "; the output head stays tied to it" if full.tie_embeddings else ""
    put("vocab_size", vocab, f"the debug models' vocabulary ({VOCAB}){tied}")
    _move_token_ids(cfg, twin, full.vocab_size, vocab, rows)
    if full.sliding_window and full.sliding_window > WINDOW:
        put("sliding_window", WINDOW, "a short run's sequence (128 to 512 tokens) must cross the window")

    args, _ = adapter.args_from_hf(twin)
    _check_faithful(full, args, n)
    rows += _kept_rows(full, ratio, args.n_experts)
    return Twin(config=twin, rows=rows, full_args=full, args=args)


def _hf_names(adapter: Any, cfg: dict) -> dict[str, str]:
    try:
        return dict(adapter.hf_names(cfg))
    except (AttributeError, TypeError):  # a workspace adapter of module functions has none
        return {}


def _cut_lists(cfg: dict, twin: dict, n: int, full_layers: int, rows: list[TwinRow]) -> None:
    for key in PER_LAYER_LISTS:
        value = cfg.get(key)
        if not isinstance(value, list):
            continue
        if key == "mlp_only_layers":  # indices, not one entry per layer
            cut = [i for i in value if isinstance(i, int) and i < n]
        else:
            cut = value[:n]
        if cut != value:
            twin[key] = cut
            rows.append(TwinRow(key, _brief(value), _brief(cut), f"the first {n} layers' entries"))
    mwl = cfg.get("max_window_layers")
    if isinstance(mwl, int) and mwl >= full_layers and mwl != n:
        twin["max_window_layers"] = n  # "no layer from here on is windowed" keeps its meaning
        rows.append(TwinRow("max_window_layers", mwl, n, "still past the last layer"))


def _brief(v: list) -> str:
    if len(v) <= 6:
        return str(v)
    distinct = sorted({str(x) for x in v})
    return f"{len(v)} entries ({', '.join(distinct[:3])}{', ...' if len(distinct) > 3 else ''})"


def _move_token_ids(cfg: dict, twin: dict, full_vocab: int, vocab: int, rows: list[TwinRow]) -> None:
    """Token ids at or past the twin's vocabulary keep their distance from its end (an id the
    embedding cannot hold would break the upstream model's padding_idx and the loss)."""

    def move(t):
        if isinstance(t, int) and not isinstance(t, bool) and vocab <= t < full_vocab:
            return vocab - (full_vocab - t)
        return t

    for key, value in cfg.items():
        if not key.endswith("_token_id"):
            continue
        moved = [move(t) for t in value] if isinstance(value, list) else move(value)
        if moved != value:
            twin[key] = moved
            rows.append(TwinRow(key, value, moved, "kept at the same distance from the vocabulary's end"))


def _check_faithful(full: TransformerArgs, twin: TransformerArgs, n: int) -> None:
    bad = [f for f in KEPT if getattr(full, f) != getattr(twin, f)]
    if full.n_heads // full.n_kv_heads != twin.n_heads // twin.n_kv_heads:
        bad.append("the GQA ratio")
    if bool(full.shared_expert_hidden_dim) != bool(twin.shared_expert_hidden_dim):
        bad.append("the shared expert")
    if twin.n_layers != n or [layer_kind(twin, i) for i in range(n)] != [layer_kind(full, i) for i in range(n)]:
        bad.append("the layer pattern")
    scalar = lambda e: {k: v for k, v in e.items() if isinstance(v, (int, float, str, bool, type(None)))}  # noqa: E731
    if scalar(full.extra) != scalar(twin.extra):
        bad.append("args.extra")
    if bad:
        raise TwinError(
            f"the twin config does not read back with the full model's {', '.join(bad)}: the adapter reads a "
            "size key this derivation does not shrink; pass --no-twin, or shrink config.json by hand"
        )


def _kept_rows(full: TransformerArgs, ratio: int, twin_experts: int) -> list[TwinRow]:
    """The structural features the twin keeps, one row each (the full and twin values are equal)."""
    out = [
        TwinRow("head_dim", full.head_dim, full.head_dim, "kept"),
        TwinRow(
            "GQA ratio", f"{full.n_heads}:{full.n_kv_heads}", f"{ratio}:1", f"kept ({ratio} query heads a kv head)"
        ),
    ]
    rope = "llama3 scaling" if full.rope_scaling else "default"
    out.append(TwinRow("RoPE", f"theta {full.rope_theta:g}, {rope}", "same", "kept"))
    flags = [(f, getattr(full, f)) for f in ("qk_norm", "qkv_bias", "out_bias", "tie_embeddings", "norm_eps")]
    if full.final_softcap:
        flags.append(("final_softcap", full.final_softcap))
    if full.n_experts:
        flags += [("top_k", full.top_k), ("norm_topk_prob", full.norm_topk_prob)]
        if twin_experts == full.n_experts:
            flags.append(("n_experts", full.n_experts))
    out += [TwinRow(name, value, value, "kept") for name, value in flags]
    return out
