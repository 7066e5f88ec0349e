"""A twin: a small config with the structure of a real-size one, for checking runs on a small machine.

    twin = derive_twin(hf_config, adapter)              # Twin(config=..., rows=[...])
    twin = derive_twin(hf_config, adapter, layers=4, width=512, experts=16)

The twin is the HF config dict itself with the sizes shrunk, so the same model_type, the
same upstream class and the same adapter read it, and every key that is not a size stays
as written: head_dim, QK-norm, biases, the RoPE type, theta and scaling, the norm epsilon,
soft-caps, tied embeddings, MoE top-k, the router's normalisation, the load-balancing
coefficient, the expert layout.

What shrinks, and to what (the debug models' cost, so eager and parity run in seconds on
a CPU):
- layers (onboard/sizing/twin/kept_layers.py): the first ones holding one full period of the layer
  pattern (sliding/full alternation, RoPE-skip layers, MoE every k-th layer) after the leading
  dense layers, at least MIN_LAYERS, then the first layer of each kind those miss (a pattern
  that is not periodic); per-layer lists (layer_types, mlp_only_layers, no_rope_layers) are
  rewritten for the layers kept;
- heads (onboard/sizing/twin/heads.py): MHA stays MHA, MQA keeps its one key/value head, GQA
  keeps 2 key/value heads and its ratio (32:8 -> 8:2, 64:8 -> 16:2, 64:4 -> 32:2), head_dim kept;
- hidden_size: WIDTH whatever the heads, so twins of every family are equally wide. Where the
  full config derives head_dim from hidden_size (no head_dim, or head_dim null) and the family
  and its upstream class read an explicit one (Llama, Mistral, Mixtral), the twin's config.json
  says head_dim explicitly; where the family derives it whatever the config says, hidden_size is
  query heads x head_dim, the narrowest width that keeps the ratio. A multiple of the query heads
  where the config class demands that, and of MULTIPLE (16, for float8's scaled matmul) where free;
- intermediate sizes (dense, expert, shared expert): scaled with hidden_size, multiples of MULTIPLE;
- vocab_size: VOCAB (token ids past it are moved to the same distance from its end);
- a sliding window longer than WINDOW: WINDOW, so a short run's sequence crosses it;
- experts: at most max(EXPERTS, 2 x top-k) (or `experts`), top-k kept and below the count.

Each size is written under the key the config uses for it (the HF-name table,
titan_core/models/common/hf_keys.py); what only shrinks and which layers stay follow the rules a
compat tiny config shares (onboard/sizing/shrink.py).

The result is checked by reading it back through the adapter: the structural fields must
equal the full model's, the heads must be the ones derived and each twin layer must have
the kind of the full model's layer it stands for; anything else is a TwinError naming the
field. The table's rows of what was kept are read from the twin itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from titan_core.models.common.args import ModelArgs, TransformerArgs
from titan_core.config.hf_keys import names_in

from onboard.sizing.twin.flux_twin import derive_flux_twin
from onboard.sizing.shrink import moved_token_ids, shrinks, shrunk
from onboard.sizing.twin.heads import MULTIPLE, WIDTH, HeadsError, kind, ratio, twin_heads
from onboard.sizing.twin.kept_layers import (
    describe_layers, kinds_label, layer_kinds, pattern_layers, select_layers, select_lists,
)  # fmt: skip

OWN_TWINS = {"flow": derive_flux_twin}
"""{model kind (ModelKind.name): its twin rule} for the kinds whose configs are not a decoder's
(flux_twin.py: a diffusers FLUX config); every other kind is shrunk as a decoder below."""
VOCAB = 2048
WINDOW = 64
"""The debug models' shapes (titan_core/models/*/flavors.py): vocab 2048, window 64 (WIDTH: dim 256)."""
EXPERTS = 16
"""At most max(EXPERTS, 2 x top-k) experts: the reference expert loop (and HF's) runs a handful of
small ops per expert, so 128 experts make a training step take seconds on a busy 2-core CPU, while
twice top-k keeps the routing a real choice (half the experts idle for each token)."""

KEPT = ("head_dim", "qk_norm", "qkv_bias", "out_bias", "rope_theta", "rope_scaling", "rope_skip_every", "norm_eps",
        "final_softcap", "tie_embeddings", "global_every", "top_k", "norm_topk_prob", "moe_every", "aux_loss_coef",
        "max_seq_len")  # fmt: skip
"""Native fields the twin must read back exactly as the full model has them."""


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
    full_args: ModelArgs | None = None
    args: ModelArgs | None = None
    layers: list[int] = field(default_factory=list)
    """The full model's layers the twin's stand for, in order (twin layer p is full layer layers[p])."""

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


def describe_args(a: ModelArgs | None) -> str:
    if a is None:
        return "?"
    moe = f", {a.n_experts} experts top-{a.top_k}" if a.n_experts else ""
    heads = f"{a.n_heads}/{a.n_kv_heads} heads of {a.head_dim}"
    return f"{a.n_layers} layers, hidden {a.dim}, {heads}, vocab {a.vocab_size}{moe}"


def _show(v: Any) -> str:
    return "-" if v is None else str(v)


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
    reads it; `layers` (the first layers kept), `width` (hidden_size) and `experts` override the
    choices. TwinError for a knob out of range or a twin the adapter reads back unfaithfully."""
    full, _ = adapter.args_from_hf(cfg)
    own = OWN_TWINS.get(full.kind.name)
    if own is not None:
        try:
            config, own_rows = own(cfg, adapter, layers=layers, width=width, experts=experts)
        except ValueError as e:
            raise TwinError(str(e)) from None
        return Twin(config=config, rows=[TwinRow(*r) for r in own_rows], full_args=full,
                    args=adapter.args_from_hf(config)[0])  # fmt: skip
    # each size goes under the key the adapter reads it from, else the one the config uses (the HF-name table's)
    names = {**names_in(cfg), **_hf_names(adapter, cfg)}
    rows: list[TwinRow] = []
    twin = dict(cfg)

    def put(native: str, value: Any, why: str) -> None:
        key = names[native]
        old = cfg.get(key, getattr(full, native, None))
        if key in cfg or value != old:
            twin[key] = value
        if value != old:
            rows.append(TwinRow(key, old, value, why))

    kept = _layers(cfg, twin, full, layers, put, rows)
    # the class computes head_dim as hidden_size // heads when the config gives none (absent or null):
    # the twin says it explicitly where the family reads it, else its width is heads x head_dim
    derived = cfg.get(names["head_dim"]) is None
    derives = derived and not _reads_head_dim(adapter, cfg, names["head_dim"], full)
    if derived and not derives:
        twin[names["head_dim"]] = full.head_dim
    width_free = bool(getattr(adapter, "width_free", lambda c: True)(cfg)) and not derives
    dim, heads = _heads_and_width(full, width, derives, width_free, put)
    scale = dim / full.dim
    put(
        "ffn_hidden_dim",
        shrunk(full.ffn_hidden_dim, _round(full.ffn_hidden_dim * scale)),
        f"scaled with hidden_size ({full.dim} -> {dim})",
    )
    if full.n_experts:
        moe = shrunk(full.moe_hidden_dim, _round(full.moe_hidden_dim * scale))
        put("moe_hidden_dim", moe, "scaled with hidden_size")
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
    vocab = shrunk(full.vocab_size, VOCAB)
    tied = "; the output head stays tied to it" if full.tie_embeddings else ""
    put("vocab_size", vocab, f"the debug models' vocabulary ({VOCAB}){tied}")
    _move_token_ids(cfg, twin, full.vocab_size, vocab, rows)
    window = full.sliding_window or _listed_window(cfg, names["sliding_window"])
    if shrinks(window, WINDOW):
        put("sliding_window", WINDOW, "a short run's sequence (128 to 512 tokens) must cross the window")

    args, _ = adapter.args_from_hf(twin)
    _check_faithful(full, cfg, args, twin, kept, heads)
    rows += _kept_rows(full, cfg, args, twin, explicit=derived and not derives)
    return Twin(config=twin, rows=rows, full_args=full, args=args, layers=kept)


def _layers(cfg: dict, twin: dict, full: TransformerArgs, layers: int | None, put, rows: list[TwinRow]) -> list[int]:
    """Choose the full model's layers the twin keeps (onboard/sizing/twin/kept_layers.py), write the layer
    count and the per-layer lists into `twin`; the kept layers' indices."""
    least, why_layers = pattern_layers(full)
    if layers is not None and not least <= layers <= full.n_layers:
        raise TwinError(
            f"--twin-layers {layers}: must be between {least} ({why_layers}) and the model's {full.n_layers}"
        )
    n = least if layers is None else layers
    kept = select_layers(full, cfg, n)
    added = describe_layers(kept, n)
    why = why_layers if layers is None else "--twin-layers"
    put("n_layers", len(kept), why + (f"; {added}" if added else ""))
    rows += [TwinRow(*r) for r in select_lists(cfg, twin, kept)]
    mwl = cfg.get("max_window_layers")
    if isinstance(mwl, int) and mwl >= full.n_layers and mwl != len(kept):
        twin["max_window_layers"] = len(kept)  # "no layer from here on is windowed" keeps its meaning
        rows.append(TwinRow("max_window_layers", mwl, len(kept), "still past the last layer"))
    return kept


def _heads_and_width(
    full: TransformerArgs, width: int | None, derives: bool, width_free: bool, put
) -> tuple[int, tuple[int, int]]:
    """Put the twin's heads and hidden_size (onboard/sizing/twin/heads.py); (hidden_size, (query heads,
    key/value heads)). `derives`: the family derives head_dim from hidden_size whatever the config says."""
    if width is not None and width < 1:
        raise TwinError(f"--twin-width {width}: must be a positive integer")
    if width is not None and not derives and width % MULTIPLE:
        near = sorted({width // MULTIPLE * MULTIPLE, -(-width // MULTIPLE) * MULTIPLE} - {0})
        raise TwinError(
            f"--twin-width {width}: a twin's widths are multiples of {MULTIPLE} (float8's scaled matmul needs "
            f"dimensions divisible by 16); e.g. --twin-width {', '.join(map(str, near))}"
        )
    try:
        heads = twin_heads(full, width=width, derives=derives)
    except HeadsError as e:
        raise TwinError(str(e)) from None
    h, kv, hd = heads.n_heads, heads.n_kv_heads, full.head_dim
    target = width if width is not None else WIDTH
    if derives:
        dim, why_dim = h * hd, f"query heads x head_dim ({h} x {hd}): this model derives head_dim from it"
        if width is None and kind(full) != "MHA":
            why_dim += f", so this is the narrowest width that keeps the GQA ratio {ratio(full)}"
    else:
        dim, why_dim = target, "--twin-width" if width is not None else (
            f"the debug models' width ({WIDTH}) whatever the heads, as for every family")  # fmt: skip
        step = MULTIPLE if width_free else math.lcm(MULTIPLE, h)
        if dim % step:
            dim = -(-target // step) * step
            why_dim = f"{target} rounded up to a multiple of the {h} query heads, which this config class requires"
    if dim > full.dim:
        dim, h, kv, why_dim = full.dim, full.n_heads, full.n_kv_heads, "the full model is no wider"
    put("n_heads", h, heads.why)
    put("n_kv_heads", kv, heads.why)
    put("dim", dim, why_dim)
    return dim, (h, kv)


def _reads_head_dim(adapter: Any, cfg: dict, key: str, full: TransformerArgs) -> bool:
    """Whether an explicit head_dim written into a config that derives it is read as written: by the
    adapter, and upstream by the class of its model_type. A family's own model_types are read as its
    adapter reads them (Llama, Mistral and Qwen2's classes take an explicit head_dim); another class
    must declare head_dim (MixtralConfig does): one that does not keeps the key as a stray attribute,
    and its model may derive head_dim from hidden_size regardless (Falcon's attention)."""
    probe = 2 * full.head_dim
    try:
        read = adapter.args_from_hf({**cfg, key: probe})[0].head_dim
    except Exception:  # noqa: BLE001 -- whatever the adapter refuses the key with: it does not take one
        return False
    if read != probe:
        return False
    model_type = cfg.get("model_type")
    return model_type in getattr(adapter, "hf_model_types", ()) or _upstream_declares(model_type, key) is not False


def _upstream_declares(model_type: Any, key: str) -> bool | None:
    """Whether transformers' config class of `model_type` declares `key`; None where transformers is
    not installed or has no such model_type (the adapter's reading then decides)."""
    try:  # lazy: the [hf] extra
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return None
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None
    try:
        cls = CONFIG_MAPPING[model_type]
    except Exception:  # noqa: BLE001 -- a class transformers cannot import here: nothing to say
        return None
    return any(key in vars(c) or key in vars(c).get("__annotations__", {}) for c in cls.__mro__)


def _listed_window(cfg: dict, key: str) -> int | None:
    """The window of the layers `layer_types` lists as sliding, where the args cannot say it (a
    pattern that is not periodic reads as every layer global on the transformers path)."""
    window = cfg.get(key)
    types = cfg.get("layer_types")
    return window if isinstance(window, int) and isinstance(types, list) and "sliding_attention" in types else None


def _hf_names(adapter: Any, cfg: dict) -> dict[str, str]:
    try:
        return dict(adapter.hf_names(cfg))
    except (AttributeError, TypeError):  # a workspace adapter of module functions has none
        return {}


def _move_token_ids(cfg: dict, twin: dict, full_vocab: int, vocab: int, rows: list[TwinRow]) -> None:
    """Token ids at or past the twin's vocabulary keep their distance from its end (an id the
    embedding cannot hold would break the upstream model's padding_idx and the loss)."""

    def move(t):
        if isinstance(t, int) and not isinstance(t, bool) and vocab <= t < full_vocab:
            return vocab - (full_vocab - t)
        return t

    for key, moved in moved_token_ids(cfg, move).items():
        twin[key] = moved
        rows.append(TwinRow(key, cfg[key], moved, "kept at the same distance from the vocabulary's end"))


def _check_faithful(
    full: TransformerArgs, cfg: dict, twin: TransformerArgs, twin_cfg: dict, kept: list[int], heads: tuple[int, int]
) -> None:
    """TwinError unless the twin reads back with the full model's structure: the KEPT fields, the
    `heads` derived (of the full model's kind: MHA, MQA, GQA), and layer p of the kind of the full
    model's layer kept[p]."""
    bad = [f for f in KEPT if getattr(full, f) != getattr(twin, f)]
    if kind(full) != kind(twin) or (twin.n_heads, twin.n_kv_heads) != heads:
        bad.append(f"attention heads ({kind(full)} {heads[0]}:{heads[1]})")
    if bool(full.shared_expert_hidden_dim) != bool(twin.shared_expert_hidden_dim):
        bad.append("the shared expert")
    full_kinds, twin_kinds = layer_kinds(full, cfg), layer_kinds(twin, twin_cfg)
    if twin.n_layers != len(kept) or twin_kinds != [full_kinds[i] for i in kept]:
        bad.append("the layer pattern")
    scalar = lambda e: {k: v for k, v in e.items() if isinstance(v, (int, float, str, bool, type(None)))}  # noqa: E731
    if scalar(full.extra) != scalar(twin.extra):
        bad.append("args.extra")
    if not bad:
        return
    hint = "pass --no-twin, or shrink config.json by hand"
    if "head_dim" in bad:  # the class derives head_dim from a width this derivation took as free
        hint = (f"the config derives head_dim from hidden_size: --twin-width {twin.n_heads * full.head_dim} keeps "
                f"head_dim {full.head_dim} with {twin.n_heads} query heads; or pass --no-twin")  # fmt: skip
    raise TwinError(
        f"the twin config does not read back with the full model's {', '.join(bad)}: the adapter reads a "
        f"size key this derivation does not shrink; {hint}"
    )


def _kept_rows(
    full: TransformerArgs, cfg: dict, twin: TransformerArgs, twin_cfg: dict, *, explicit: bool = False
) -> list[TwinRow]:
    """The structural features, one row each, the twin column read from the twin itself. `explicit`: the
    twin's config says head_dim where the full one derives it from hidden_size."""
    why_hd = "kept" + (", written into the twin's config (the full config derives it from hidden_size)" if explicit
                       else "")  # fmt: skip
    hd = TwinRow("head_dim", full.head_dim, twin.head_dim, why_hd)
    per = f"{ratio(twin)} query heads a key/value head"
    if ratio(twin) == ratio(full) or kind(full) == "MHA":
        why_ratio = f"{kind(twin)}, {per}"
    else:
        why_ratio = (f"{kind(twin)}, {per}: the full model's ratio {ratio(full)} is not kept, so the twin's "
                     "key/value expansion groups differ (parity names gqa_ratio among the features the twin does "
                     "not hold)")  # fmt: skip
    out = [hd, TwinRow("GQA ratio", f"{full.n_heads}:{full.n_kv_heads}", f"{twin.n_heads}:{twin.n_kv_heads}",
                       why_ratio)]  # fmt: skip
    full_kinds, twin_kinds = kinds_label(full, cfg), kinds_label(twin, twin_cfg)
    if "," in full_kinds:
        out.append(TwinRow("layer kinds", full_kinds, twin_kinds, "at least one layer of each kind"))
    rope = lambda a: f"theta {a.rope_theta:g}, {'llama3 scaling' if a.rope_scaling else 'default'}"  # noqa: E731
    out.append(TwinRow("RoPE", rope(full), "same" if rope(twin) == rope(full) else rope(twin), "kept"))
    flags = ["qk_norm", "qkv_bias", "out_bias", "tie_embeddings", "norm_eps"]
    flags += ["final_softcap"] if full.final_softcap else []
    flags += ["top_k", "norm_topk_prob"] if full.n_experts else []
    flags += ["n_experts"] if full.n_experts and twin.n_experts == full.n_experts else []
    out += [TwinRow(f, getattr(full, f), getattr(twin, f), "kept") for f in flags]
    return out
