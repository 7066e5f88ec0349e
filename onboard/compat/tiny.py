"""The tiny config of a `model_type`, built through its transformers config class's own constructor
arguments: 2 layers, hidden 64, vocab 256, experts, windows and low-rank widths shrunk wherever the
class has an argument for them, under whatever name the class gives it (GPT-2's `n_embd`, Falcon's
`num_kv_heads`, OPT's `ffn_dim`). Per-layer type lists keep one layer of each kind (a hybrid stays
a hybrid). A composite config (text beside vision or audio) gets its text config shrunk the same
way. `NotProbed` with why where the class cannot be built that small. What shrinks, under which
names, and which layers stay are the rules a twin follows too (onboard/sizing/shrink.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from onboard.errors import BadInput
from onboard.sizing.shrink import entries_of, first_of_each_kind, moved_token_ids, renumbered, shrinks, shrunk
from titan_core.config.hf_keys import HF_KEYS
from titan_core.models.transformers.hf_classes import require_transformers

ROLES: dict[str, tuple[int, tuple[str, ...]]] = {
    "hidden": (
        64,
        (
            *HF_KEYS["dim"], "word_embed_proj_dim",
            # a vision or audio adapter's widths, which its validators tie to the hidden sizes (Dots3)
            *("adapter_in_dim", "adapter_input_size", "adapter_out_dim"),
        ),
    ),
    "layers": (2, (*HF_KEYS["n_layers"], "num_encoder_layers", "num_layers_per_stack", "encoder_layers")),
    "heads": (
        4,
        (
            *HF_KEYS["n_heads"], "num_encoder_attention_heads",
            # BART-style configs map `num_attention_heads` to the encoder's count, which head_dim is derived from
            "encoder_attention_heads",
        ),
    ),
    "kv_heads": (2, HF_KEYS["n_kv_heads"]),
    "head_dim": (16, HF_KEYS["head_dim"]),
    "global_head_dim": (32, ("global_head_dim",)),  # Gemma-4's full-attention layers: wider than the others
    "rotary_dim": (8, ("rotary_dim",)),  # partial rotary (GPT-J, CodeGen): half the tiny head
    "ffn": (128, (*HF_KEYS["ffn_hidden_dim"], "encoder_ffn_dim")),
    # Inkling-2's head is `unpadded_vocab_size` wide, its embedding `vocab_size`: both shrink
    "vocab": (256, (*HF_KEYS["vocab_size"], "vocab_size_per_layer_input", "unpadded_vocab_size")),
    "per_layer_input": (16, ("hidden_size_per_layer_input",)),  # Gemma-3n/4's per-layer embeddings
    "positions": (1024, HF_KEYS["max_seq_len"]),
    "experts": (4, HF_KEYS["n_experts"]),
    "experts_per_token": (2, HF_KEYS["top_k"]),
    # LongCat-Flash's zero-compute experts (256 beside 512 routed): 2 beside the 4, the same 1:2
    "zero_experts": (2, ("zero_expert_num",)),
    # group-limited routing (DeepSeek-V3): 2 groups of the 4 experts, the best 1 group's 2 chosen from
    "expert_groups": (2, ("n_group", "num_expert_group")),
    "chosen_groups": (1, ("topk_group",)),
    "expert_ffn": (32, (*HF_KEYS["moe_hidden_dim"], *HF_KEYS["shared_expert_hidden_dim"])),
    # multi-head latent attention (DeepSeek-V2/V3 and their kin): its low-rank widths
    "latent_rank": (32, ("kv_lora_rank", "q_lora_rank")),
    "latent_head": (8, ("qk_rope_head_dim", "qk_nope_head_dim")),
    "value_head": (16, ("v_head_dim",)),
    # linear-attention and Mamba layers of hybrids
    "linear_heads": (2, ("linear_num_key_heads", "linear_num_heads")),
    "linear_value_heads": (4, ("linear_num_value_heads",)),
    "linear_head_dim": (16, ("linear_key_head_dim", "linear_value_head_dim", "linear_head_dim")),
    # Mamba heads x head width = the usual expand (2) x hidden, which the classes' validators check
    "mamba_heads": (8, ("mamba_n_heads", "mamba_num_heads")),
    "mamba_head_dim": (16, ("mamba_d_head", "mamba_head_dim")),
    "indexer": (2, ("index_n_heads", "indexer_n_heads", "indexer_kv_heads")),
    "indexer_dim": (16, ("index_head_dim", "indexer_head_dim")),
    # how many keys (or key blocks) the indexer keeps per query: below the parity rung's 512 tokens,
    # so the selection really drops keys (at 2048 it would keep every one and prove nothing)
    "index_budget": (32, ("index_topk", "indexer_budget")),
    "index_blocks": (2, ("index_topk_blocks",)),
    # a model whose first layers are dense keeps one dense layer (DeepSeek-V3's first_k_dense_replace
    # is 3: of 2 tiny layers none would be MoE); Gemma-3n's last layers reuse earlier layers' keys
    "dense_prefix": (1, ("first_k_dense_replace", "num_dense_layers")),
    "kv_shared_layers": (2, ("num_kv_shared_layers",)),
    "window": (32, HF_KEYS["sliding_window"]),
}
"""Each size the probe sets, by role: (tiny value, the constructor arguments that carry it in some
class: the HF-name table's names of that size, titan_core/models/common/hf_keys.py, and the sizes that
shrink with it). An argument is set only where the class has it with a larger integer default (or a
DERIVED role's None): a default of None otherwise means the class lacks the feature (no window),
and the probe adds no feature the architecture does not have (`shrinks`, onboard/sizing/shrink.py: the
rules a twin shares). A window (32) is below SEQ_LEN, so a windowed model really masks."""
DERIVED = ("kv_heads", "head_dim", "experts_per_token")
"""Roles set even where the class's default is None: it derives them (head_dim = hidden / heads,
as many key/value heads as heads), and some classes' models read the None before deriving
(DeepSeek-V2's router reads a top-k of None)."""
SET_ALWAYS = ("positions",)
"""Roles set whatever the class's default: the parity rung runs 512 tokens (plus RoBERTa's offset
of 2 positions), which a class with 128 learned positions (Blenderbot) cannot embed."""
PROPORTIONAL = ("dim_model_base",)
"""Arguments a model reads as a ratio to its hidden width, shrunk with it so that the ratio stays the
class's: MiniCPM3 divides its hidden states by hidden_size / dim_model_base (10 by default) before
the head, and a tiny hidden of 64 against the default base of 256 would multiply them by 4, so a
fresh model's logits would start 40 times the released model's scale."""
SIZES = {name: value for value, names in ROLES.values() for name in names}
"""Every constructor argument the probe may set, with its tiny value."""
FLAGS = {"is_decoder": True, "causal": True}
"""Switches a class documents for use as a causal LM, set where it has them: an encoder class
(BERT, RoBERTa, Reformer) attends causally, as its causal-LM class requires, only as a decoder;
XLM only with `causal`."""
OWN_ARGUMENTS: dict[str, dict[str, Any]] = {
    # layers described by a pattern and a repeat count, not a per-layer list
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # the layer count is the sum of three stacks', and a released config counts a layer's attention
    # and MLP blocks apart (so twice the layers, "mlp" between the kinds): 3 layers, one per stack
    "dory": {
        **{"num_hidden_layers": 6, "n_input_layers": 2, "n_recurrent_layers": 2, "n_output_layers": 2},
        "layer_types": ["sliding_attention", "mlp", "sliding_attention", "mlp", "full_attention", "mlp"],
    },
    # defaults the class's own model cannot be built from; a released config sets them
    # (dots.llm1: 128 routed experts, 2 shared; DBRX: its attention's rope_theta and clip_qkv; LFM2-8B-A1B: conv
    # and full-attention layers)
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1},
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # Mamba-2's SSM heads times their width must be the expanded width (2 x 64), which its validator checks
    "mamba2": {"num_heads": 8, "head_dim": 16},
    # Zamba's hybrid layers share one transformer block, which transformers ties across them: it
    # takes two of them (one of each kind would leave the tie nothing to tie to)
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
    # Moshi's text model hands its audio vocabulary to its depth decoder's config, which wants an int
    # (the class leaves it None without an audio encoder config)
    "moshi": {"audio_vocab_size": 256},
    # X-MOD runs a per-language adapter and refuses a forward until a language is chosen
    "xmod": {"default_language": "en_XX"},
    # Flint's default mlp_only_layers makes both tiny layers dense: keep layer 0 dense, layer 1 MoE
    "flint": {"mlp_only_layers": [0]},
    # unreleased classes whose modeling reads what their defaults leave None: the RoPE of each
    # layer type, the sparse-attention indexer's budget
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "qwen4_exp_text": {
        **{"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16},
        **{"indexer_budget": 32, "indexer_compress_ratio": 4},
    },
}
"""Constructor arguments a class sizes its model by that no role names, or that its defaults leave
unset while its model needs them, by the config class's model_type (a composite's text config by its
own); a dict value is merged into the sub-config the probe shrank."""
RELAXED: tuple[dict[str, Any], ...] = (
    {"kv_heads": "heads"},  # a class whose validator wants as many key/value heads as query heads
    {"experts_per_token": 1},  # a class that routes each token to one expert only
)
"""What the probe changes, in turn, when a class's validator refuses the tiny sizes: a role set to
another role's tiny value or to a number."""
SEQ_LEN = 64
"""The recipe's training.seq_len in the probe's workspace (new-model writes 128)."""
MAX_PARAMS = 20_000_000
"""A tiny config still above this has sizes the probe does not know how to shrink: not probed."""
MAX_LAYERS = 4
"""A per-layer type list keeps one layer of each kind, up to this many layers."""
REASON_CHARS = 200


def one_line(text: str) -> str:
    """`text` as one table-safe line of at most REASON_CHARS characters."""
    line = " ".join(str(text).split()).replace("|", "/")
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


class NotProbed(Exception):
    """The probe cannot build a tiny config of this model_type; the message says why."""


def causal_lm_types() -> list[str]:
    """Every model_type transformers maps to a causal-LM class, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: an optional extra

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_types(model_types: list[str]) -> list[str]:
    """`model_types` if transformers has a causal-LM class for each; BadInput naming the first that has none."""
    require_transformers()
    known = causal_lm_types()
    for mt in model_types:
        if mt not in known:
            close = [k for k in known if mt.lower() in k][:5]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise BadInput(f"MODEL_TYPE '{mt}': transformers has no causal-LM class of that model_type{hint}")
    return list(dict.fromkeys(model_types))


def tiny_config(model_type: str) -> dict[str, Any]:
    """The config dict of a tiny `model_type`, from its transformers config class; NotProbed if it cannot be."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # lazy: an optional extra

    if model_type not in CONFIG_MAPPING:
        raise NotProbed(f"transformers has no config class for '{model_type}'")
    cls = CONFIG_MAPPING[model_type]
    default = _build(cls, {}, "cannot be built offline")
    text_cls = _text_config_class(cls, default)
    own = _merged(_tiny_sub_configs(cls, default, skip=text_cls[0] if text_cls else None), _own(cls))
    if text_cls is None:
        cfg = _build_tiny(cls, default.to_dict(), own).to_dict()
    else:  # composite: the text config shrunk as a config of its own
        key, text_default = text_cls
        text = _build_tiny(type(text_default), text_default.to_dict(), _own(type(text_default)))
        kw = {key: text.to_dict(), **own, **_special_tokens(default.to_dict())}
        cfg = _build(cls, kw, f"refuses a tiny {type(text_default).__name__}").to_dict()
    cfg["model_type"] = model_type
    return cfg


def _own(cls) -> dict[str, Any]:
    return OWN_ARGUMENTS.get(getattr(cls, "model_type", "") or "", {})


def _merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """`base` with `more` over it, a dict in `more` merged into the dict `base` has under its key."""
    out = dict(base)
    for key, value in more.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _tiny_sub_configs(cls, default, *, skip: str | None) -> dict[str, Any]:
    """Each sub-config other than the text one (a vision or audio encoder some causal-LM classes
    build inside: GIT, Phi-4-multimodal) shrunk the same way, as a dict; one its class refuses
    small stays as the class builds it."""
    out = {}
    for key, sub_cls in (getattr(cls, "sub_configs", None) or {}).items():
        sub = getattr(default, key, None)
        if key == skip or sub is None or not dataclasses.is_dataclass(sub_cls) or not hasattr(sub, "to_dict"):
            continue
        try:
            out[key] = _build_tiny(sub_cls, sub.to_dict(), {}).to_dict()
        except NotProbed:
            continue
    return out


def _build_tiny(cls, default: dict[str, Any], own: dict[str, Any]):
    """`cls` built tiny: the tiny arguments, then each RELAXED change in turn while its validator refuses."""
    kw = {**tiny_arguments(cls, default), **own}
    try:
        return _build(cls, kw, "refuses the tiny sizes")
    except NotProbed as refused:
        for change in RELAXED:
            relaxed = {**kw, **_relax(kw, change)}
            if relaxed == kw:
                continue
            try:
                return _build(cls, relaxed, "refuses the tiny sizes")
            except NotProbed:
                continue
        raise refused from None


def _relax(kw: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """The arguments of `kw` that `change` (role -> value or another role) sets anew."""
    out = {}
    for role, value in change.items():
        if isinstance(value, str):
            value = ROLES[value][0]
        out.update({name: value for name in ROLES[role][1] if name in kw})
    return out


def _build(cls, kw: dict[str, Any], what: str):
    try:
        return cls(**kw)
    except Exception as e:  # noqa: BLE001 -- any refusal of the class is the reason
        args = ", ".join(kw) if len(kw) < 6 else "..."
        raise NotProbed(f"{cls.__name__}({args}) {what}: {type(e).__name__}: {e}") from None


def _text_config_class(cls, default) -> tuple[str, Any] | None:
    """(the argument, the default text config) of a composite config; None for a text-only one."""
    from titan_core.models.transformers.hf_classes import text_config_key  # lazy: transformers, an optional extra
    from titan_core.models.common.mapping_errors import AdapterError  # lazy: beside it

    try:
        key = text_config_key(default)
    except AdapterError as e:
        raise NotProbed(str(e)) from None
    if key is None:
        return None
    if key not in {f.name for f in dataclasses.fields(cls)}:
        raise NotProbed(f"{cls.__name__} keeps its text config under '{key}', which its constructor does not take")
    return key, getattr(default, key)


def tiny_arguments(cls, default: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments of `cls` that make it tiny, read from its own fields (`default`:
    the class's default config as a dict; the values a constructor fills in stay the class's)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    derived = {name for role in DERIVED for name in ROLES[role][1]}
    always = {name for role in SET_ALWAYS for name in ROLES[role][1]}
    # an argument may be stored under another name (Bailing's `num_local_experts` is `num_experts`)
    stored = getattr(cls, "attribute_map", None) or {}
    kw = {
        name: value
        for name, value in SIZES.items()
        if name in fields
        and (shrinks(default.get(name, default.get(stored.get(name, name))), value, name in derived) or name in always)
    }
    if "group" in str(default.get("topk_method", "")):  # group-limited routing with groups the class derives
        kw.update({n: ROLES[r][0] for r in ("expert_groups", "chosen_groups") for n in ROLES[r][1] if n in fields})
    if any(name in kw for name in ROLES["latent_rank"][1]):  # latent attention expands keys to every head
        kw.update(_relax(kw, {"kv_heads": "heads"}))
        # where the class's head_dim is its RoPE width (LongCat-Flash sizes its rotary tables by it)
        if "head_dim" in kw and default.get("head_dim") == default.get("qk_rope_head_dim") and "qk_rope_head_dim" in kw:
            kw["head_dim"] = kw["qk_rope_head_dim"]
    kw.update(_proportional(fields, default, kw))
    kw.update({k: v for k, v in FLAGS.items() if k in fields})
    kw.update(_layer_lists(fields, default, kw))
    kw.update(_per_layer_overrides(default, kw))
    kw.update(_special_tokens(default))
    kw.update({k: 0.0 for k, v in default.items() if k in fields and _is_dropout(k) and isinstance(v, float) and v > 0})
    return kw


def _proportional(fields: set[str], default: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """The PROPORTIONAL arguments scaled by tiny hidden / default hidden (at least 1)."""
    hidden = next((n for n in ROLES["hidden"][1] if n in kw), None)
    if hidden is None or not isinstance(default.get(hidden), int):
        return {}
    out = {}
    for name in PROPORTIONAL:
        base = default.get(name)
        if name in fields and isinstance(base, int) and not isinstance(base, bool):
            out[name] = max(1, round(base * kw[hidden] / default[hidden]))
    return out


def _layer_lists(fields: set[str], default: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """Per-layer lists (`layer_types`, `mlp_layer_types`, ...: one entry per layer of the default)
    cut to one layer of each kind, in their order, sizes among them shrunk; the layer count follows
    (at least the tiny one, at most MAX_LAYERS)."""
    layers_arg, n, lists = _per_layer_lists(fields, default, kw)
    if not lists:
        return {}
    keep = _kept_layers(n, lists)
    # a size given per layer (Gemma-3n's intermediate_size) shrinks entry by entry
    tiny = lambda k, x: shrunk(x, SIZES[k]) if k in SIZES else x  # noqa: E731
    return {layers_arg: len(keep), **{k: [tiny(k, x) for x in entries_of(v, keep)] for k, v in lists.items()}}


def _per_layer_lists(fields: set[str], default: dict[str, Any], kw: dict[str, Any]):
    """(the layer-count argument, the default's layer count, {argument: its per-layer list}); the
    lists are {} where the count does not shrink or no list has one entry per layer."""
    layers_arg = next((n for n in ROLES["layers"][1] if n in kw), None)
    n = default.get(layers_arg) if layers_arg else None
    if not isinstance(n, int) or n <= ROLES["layers"][0]:
        return layers_arg, n, {}
    return layers_arg, n, {k: v for k, v in default.items() if k in fields and isinstance(v, list) and len(v) == n}


def _kept_layers(n: int, lists: dict[str, list]) -> list[int]:
    """The default's layer indices the tiny config keeps: the first of each kind (its entries across
    `lists`), topped up with the first others to the tiny count, in order."""
    kinds = [tuple(_hashable(lists[k][i]) for k in lists) for i in range(n)]
    keep = first_of_each_kind(kinds)[:MAX_LAYERS]
    while len(keep) < ROLES["layers"][0]:
        keep.append(next(i for i in range(n) if i not in keep))
    return sorted(keep)


def _per_layer_overrides(default: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """A table of per-layer overrides (Dots3's `per_layer_config`: {layer index: the sizes that differ
    in that layer}, its sliding-window layers' 64 heads of 256) kept for the layers the tiny config
    keeps, renumbered, each size the tiny config's own, or a whole multiple of it where the layer is
    that many times the class's default (so the layer stays valid against the tiny widths, and a
    wider layer stays wider: the class's per-layer code runs, at tiny sizes)."""
    table = default.get("per_layer_config")
    if not isinstance(table, dict) or not table:
        return {}
    fields = set(kw) | {k for k, v in default.items() if isinstance(v, list)}
    layers_arg, n, lists = _per_layer_lists(fields, default, kw)
    keep = _kept_layers(n, lists) if lists else range(kw.get(layers_arg, n) if layers_arg else 0)
    entries = {int(k): v for k, v in table.items()}

    def tiny(name: str, value: Any) -> Any:
        if name in kw:  # a layer wider by a whole factor stays that much wider (Gemma-4's global heads: 2x)
            base = default.get(name)
            whole = isinstance(base, int) and isinstance(value, int) and 0 < base < value and value % base == 0
            return kw[name] * (value // base) if whole else kw[name]
        return shrunk(value, SIZES[name]) if name in SIZES else value

    out = {new: {k: tiny(k, v) for k, v in entries[keep[new]].items()} for new in renumbered(entries, keep)}
    return {"per_layer_config": out}


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, (list, dict)) else value


def _is_dropout(name: str) -> bool:
    # dropout off (GPT-2's attn_pdrop / resid_pdrop / embd_pdrop default to 0.1): pretraining's usual
    # setting, and the probe asks whether the path runs the architecture, not whether kernels drop out
    return "dropout" in name or name.endswith("pdrop")


def _special_tokens(default: dict[str, Any]) -> dict[str, Any]:
    """Special tokens of the full vocabulary would index past the tiny one: the last tiny token."""
    top = ROLES["vocab"][0] - 1
    return moved_token_ids(default, lambda t: top if isinstance(t, int) and t > top else t)
