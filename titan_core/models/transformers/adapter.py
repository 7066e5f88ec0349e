"""The transformers path's adapter: weights keep their HF names, args are read for titan_core.

The model is transformers' own class, so the state-dict mapping is the identity in both
directions and a round trip is exact by construction. The config is read through
transformers' config class (its defaults and derived values, e.g. head_dim), into the
TransformerArgs titan_core needs around the model: vocabulary, depth and widths for FLOPs,
memory estimates and the data loader. The config itself travels in `args.extra["hf_config"]`,
so the model is built from args alone like every family's; a recipe override of an args
field is written back into that config under its HF name (`hf_config_for`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.mapping_errors import AdapterError
from titan_core.models.common.hf_adapter import window_pattern
from titan_core.config.hf_keys import HF_KEYS
from titan_core.models.common.validate import NATIVE_ACCEPTS, check_args, check_pad_id, check_value
from titan_core.models.common.tied import HF_TIE, Tie, same_tensor, with_tied_head
from titan_core.models.transformers.checkpoint_layout import CheckpointLayout
from titan_core.models.transformers.hf_classes import causal_lm_parts, config_object, text_config_key

HF_CONFIG_KEY = "hf_config"
"""args.extra key holding the HF config dict the model is built from."""
# TransformerArgs field -> the HF config key an override of it is written to (the HF-name table's first)
WRITE_BACK = {
    f: HF_KEYS[f][0]
    for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_hidden_dim", "max_seq_len",
              "tie_embeddings", "norm_eps", "init_std", "n_experts", "top_k", "moe_hidden_dim")
}  # fmt: skip


def _attr(c, name: str):
    """`c.<name>`, or None; for a size that varies by layer (a heterogeneous config, Gemma-4's
    head_dim; a list by layer, Gemma-3n's intermediate_size), the largest layer's: these args size
    estimates, and the model itself is built from the config as transformers reads it."""
    try:
        value = getattr(c, name, None)
    except Exception as e:  # noqa: BLE001 -- transformers' per-layer refusal; its class moves between versions
        per_layer = getattr(c, "per_layer_config", None)
        if type(e).__name__ != "AmbiguousGlobalPerLayerAttributeError" or not per_layer:
            raise
        values = [v for layer in per_layer if (v := getattr(layer, name, None)) is not None]
        return max(values) if values else None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return max(value)  # a list by layer (Gemma-3n's intermediate_size)
    return value


def _first(c, *names, default=None):
    for n in names:
        v = _attr(c, n)
        if v is not None:
            return v
    return default


NORM_EPS_KEYS = HF_KEYS["norm_eps"]
"""What transformers' configs call the epsilon of their norms."""
EXPERT_COUNT_KEYS = HF_KEYS["n_experts"]
"""What transformers' configs call the number of routed experts."""


FINAL_CAP_KEYS = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")
"""What configs call the soft-cap of the output logits: Gemma-2's, RecurrentGemma's, xLSTM's."""


def final_logit_cap(c) -> float | None:
    """The soft-cap the causal-LM class applies to its logits (cap * tanh(logits / cap)), or None."""
    cap = _first(c, *FINAL_CAP_KEYS)
    return float(cap) if cap else None


def routed_experts(c) -> int:
    """The routed experts each MoE layer of the text config `c` holds; 0 for a dense model, and for a
    config that sizes experts its model does not build (Doge's `is_moe = False`: dense MLPs)."""
    if _attr(c, "is_moe") is False:
        return 0
    n = _first(c, *EXPERT_COUNT_KEYS, default=0)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def attention_free(c) -> bool:
    """Whether a (text) config sizes no attention at all: Mamba, RWKV, xLSTM (no `num_attention_heads`)."""
    return _attr(c, "num_attention_heads") is None


def predicted_vocab(c) -> int:
    """The tokens a (text) config's model predicts, which the data must not pass: `vocab_size`, or a
    padded head's `unpadded_vocab_size` where that is smaller (Inkling cuts its logits to it)."""
    vocab, unpadded = _attr(c, "vocab_size"), _attr(c, "unpadded_vocab_size")
    return unpadded if isinstance(unpadded, int) and 0 < unpadded < vocab else vocab


def _windows(c) -> tuple[int | None, int]:
    """(sliding_window, global_every) from layer_types, for the estimates; a pattern the args
    cannot express counts every layer as global (the model itself runs transformers' pattern)."""
    types = getattr(c, "layer_types", None)
    window = getattr(c, "sliding_window", None)
    if not types or not window:
        return None, 0
    try:
        return window_pattern([window if t == "sliding_attention" else None for t in types])
    except AdapterError:
        return None, 0


def args_from_config(c, hf_cfg: dict[str, Any]) -> TransformerArgs:
    """TransformerArgs from a transformers config object (the config of the model the path builds:
    a composite's text config, `causal_lm_parts`)."""
    t = causal_lm_parts(c)[1]
    needed = ("hidden_size", "num_hidden_layers", "vocab_size")
    missing = [k for k in needed if _attr(t, k) is None]
    if missing:  # a byte-level or otherwise unsized config: said, not an AttributeError
        raise AdapterError(
            f"{type(t).__name__} has no {', '.join(missing)}: the transformers path runs decoder "
            "stacks of layers, which these sizes describe"
        )
    no_attention = attention_free(t)
    # Mamba, RWKV, xLSTM: one placeholder head of full width keeps the args valid; the model counts
    # its FLOPs from its own modules (TransformersCausalLM.flops_per_token)
    dim, heads = _attr(t, "hidden_size"), 1 if no_attention else _attr(t, "num_attention_heads")
    # each value checked (validate.py) under the key it was read from, before it is divided or converted
    prefix = "" if t is c else f"{text_config_key(c) or 'text_config'}."
    names = {f: prefix + k for f, k in WRITE_BACK.items()} | {"rope_theta": f"{prefix}rope_parameters.rope_theta"}
    names["norm_eps"] = prefix + next((k for k in NORM_EPS_KEYS if _attr(t, k) is not None), NORM_EPS_KEYS[0])
    check_args({"dim": dim, "n_layers": _attr(t, "num_hidden_layers")}, names=names)  # no head rules before head_dim
    check_value(names["n_heads"], heads, NATIVE_ACCEPTS["n_heads"])
    window, global_every = _windows(t)
    n_experts = routed_experts(t)
    sparse_step = _first(t, "decoder_sparse_step", default=1) or 1
    positions = _attr(t, "max_position_embeddings")
    kw: dict[str, Any] = dict(
        dim=dim,
        n_layers=_attr(t, "num_hidden_layers"),
        n_heads=heads,
        n_kv_heads=1 if no_attention else _first(t, "num_key_value_heads", default=heads),
        head_dim=dim if no_attention else _first(t, "head_dim", default=dim // heads),
        vocab_size=predicted_vocab(t),
        ffn_hidden_dim=_first(t, "intermediate_size", default=4 * dim),
        norm_eps=_first(t, *NORM_EPS_KEYS, default=1e-6),
        rope_theta=(getattr(t, "rope_parameters", None) or {}).get("rope_theta", 10000.0),
        max_seq_len=positions if positions not in (None, -1) else 2048,  # -1: no limit (XLNet's relative positions)
        tie_embeddings=bool(getattr(t, "tie_word_embeddings", False)),
        sliding_window=window,
        global_every=global_every,
        final_softcap=final_logit_cap(t),
        init_std=_first(t, "initializer_range", default=0.02),
        extra={HF_CONFIG_KEY: dict(hf_cfg)},
    )
    check_args(kw, names=names)
    vocab = _attr(t, "vocab_size")
    if isinstance(vocab, int):  # the embedding's rows, which padding_idx indexes
        check_pad_id(getattr(t, "pad_token_id", None), vocab, name=f"{prefix}pad_token_id")
    kw.update({k: float(kw[k]) for k in ("norm_eps", "rope_theta", "init_std")})
    if n_experts:
        kw.update(
            n_experts=n_experts,
            top_k=_first(t, "num_experts_per_tok", "top_k", default=2),
            moe_hidden_dim=_first(t, "moe_intermediate_size", "intermediate_size"),
            norm_topk_prob=bool(getattr(t, "norm_topk_prob", True)),
            shared_expert_hidden_dim=_first(t, "shared_expert_intermediate_size", default=0) or 0,
            moe_every=sparse_step,
            dense_layers=list(getattr(t, "mlp_only_layers", None) or []),
        )
    try:
        return TransformerArgs(**kw)
    except (TypeError, ValueError) as e:
        raise AdapterError(f"config does not describe valid args: {e}") from None


def hf_config_for(args: TransformerArgs) -> dict[str, Any]:
    """The HF config dict of `args`: the one it was read from, with every args field that
    differs from what that config reads as (a recipe override) written back under its HF name.

    AdapterError for a changed field with no HF key here (set it in config.json instead).
    `layer_types` follows a changed depth (the pattern repeats, as transformers builds it).
    """
    if HF_CONFIG_KEY not in args.extra:
        raise AdapterError(f"args carry no extra['{HF_CONFIG_KEY}']: these args are not the transformers path's")
    cfg = dict(args.extra[HF_CONFIG_KEY])
    config = config_object(cfg)
    base = args_from_config(config, cfg)
    changed = [
        f.name for f in fields(TransformerArgs) if f.name != "extra" and getattr(base, f.name) != getattr(args, f.name)
    ]
    if not changed:
        return cfg
    sub = text_config_key(config)  # a composite's sizes live in its text config
    target = cfg if sub is None else dict(cfg.get(sub) or causal_lm_parts(config)[1].to_dict())
    for name in changed:
        key = WRITE_BACK.get(name)
        if key is None:
            raise AdapterError(
                f"model.overrides.{name} has no HF config key on the transformers path; change config.json instead"
            )
        if name == "n_experts" and "num_local_experts" in target:
            key = "num_local_experts"
        target[key] = getattr(args, name)
    types = target.get("layer_types")
    if "n_layers" in changed and isinstance(types, list) and types:
        target["layer_types"] = [types[i % len(types)] for i in range(args.n_layers)]
    if sub is not None:
        cfg[sub] = target
    return cfg


class TransformersAdapter:
    """HF <-> titan_core for the transformers path: identity on weights, args via transformers' config."""

    hf_model_types: tuple[str, ...] = ()  # claims no model_type: the path is chosen, never inferred
    exports_whole_config = True
    """`hf_config(args)` is the whole config.json (overrides written in): an export writes it as is."""

    def args_from_hf(self, cfg: dict[str, Any]) -> tuple[TransformerArgs, set[str]]:
        """(args, consumed keys): every key is consumed, since transformers' config class reads them all."""
        return args_from_config(config_object(cfg), cfg), set(cfg)

    def from_hf(self, sd: dict[str, torch.Tensor], **_: Any) -> dict[str, torch.Tensor]:
        """The same dict: HF's in-memory names are the model's (a checkpoint in the Hub's own
        layout is read through `checkpoint_reader`)."""
        return dict(sd)

    def checkpoint_reader(self, model) -> CheckpointLayout:
        """The adapter a checkpoint of `model` (this path's model) is read through: transformers'
        own loading conversions of its class, so a checkpoint as the Hub ships it (Mixtral's
        per-expert w1/w2/w3, an old rotary inv_freq) maps as `from_pretrained` maps it."""
        return CheckpointLayout(model.hf)

    def to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The same dict; a tied head (deduplicated away, as `named_parameters` does) is emitted
        as the embedding tensor itself, which is what transformers' own `state_dict()` holds. A
        head already there under its class's own name (BioGPT's `output_projection`) is left alone."""
        out = dict(sd)
        emb = next((k for k in out if k.endswith("embed_tokens.weight")), None)
        if emb is None or any(k != emb and same_tensor(v, out[emb]) for k, v in out.items()):
            return out
        return with_tied_head(out, Tie(HF_TIE.head, emb))

    def hf_config(self, args: TransformerArgs) -> dict[str, Any]:
        """`hf_config_for(args)`, naming the causal-LM class in `architectures` when the config
        does not (what save_pretrained writes, so pipelines and the Hub know the head)."""
        cfg = hf_config_for(args)
        cls, model_config = causal_lm_parts(config_object(cfg))
        if text_config_key(config_object(cfg)) is not None:  # a composite trains (and exports) its text model
            cfg = {**model_config.to_dict(), "architectures": [cls.__name__]}
        if not cfg.get("architectures"):
            cfg["architectures"] = [cls.__name__]
        return cfg

    def unconsumed_keys(self, cfg: dict[str, Any]) -> list[str]:
        return []
