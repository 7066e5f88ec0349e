"""Hugging Face <-> native conversion for llama-style checkpoints and configs.

Families subclass `HFAdapter` and extend the key table, the per-layer hooks
(`layer_group_to_hf` / `layer_from_hf` see all tensors of one layer at once, for fused
layouts such as MoE experts) or the config reading (`extra_args_from_hf`). Conversions
are pure renames, transposes, splits and concatenations (never arithmetic on values), so
a round trip HF -> native -> HF returns bit-identical tensors.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from titan_core.models.common.args import TransformerArgs
from titan_core.config.hf_keys import HF_KEYS
from titan_core.models.common.mapping_errors import AdapterError
from titan_core.models.common.tied import HF_TIE, NATIVE_TIE, tie_default, with_tied_head, without_tied_head
from titan_core.models.common.validate import check_args, check_hf_value, check_pad_id

# native suffix -> HF suffix, per decoder layer
LAYER_KEYS: dict[str, str] = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.bias": "self_attn.o_proj.bias",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
TOP_KEYS: dict[str, str] = {
    NATIVE_TIE.embedding: HF_TIE.embedding,
    "norm.weight": "model.norm.weight",
    NATIVE_TIE.head: HF_TIE.head,
}
# native field -> the default where a config omits it (None: none), for the fields every family reads,
# each under the first of its names in the HF-name table (models/common/hf_keys.py)
READ: dict[str, Any] = {
    "dim": None, "n_layers": None, "n_heads": None, "n_kv_heads": None, "head_dim": None, "vocab_size": None,
    "ffn_hidden_dim": None, "norm_eps": 1e-6, "max_seq_len": 2048, "tie_embeddings": None,
    "init_std": 0.02,  # the std of upstream's own init (parity's init check)
}  # fmt: skip
# native field -> the HF config key it is read from, for the messages of the structural rules
HF_NAMES: dict[str, str] = {f: HF_KEYS[f][0] for f in (*READ, "rope_theta")}
# HF config keys that carry no architecture (or that we derive another way).
NEUTRAL_KEYS = frozenset(
    {
        "model_type", "architectures", *HF_KEYS["dtype"], "transformers_version",
        "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
        "attention_dropout", "pretraining_tp", "output_router_logits", "_name_or_path",
        "return_dict", "output_hidden_states", "output_attentions", "id2label", "label2id",
        "tokenizer_class", "chunk_size_feed_forward", "problem_type", "is_encoder_decoder",
    }
)  # fmt: skip


class HFAdapter:
    """Maps one family's native state dict and args to and from the HF layout."""

    hf_model_types: tuple[str, ...] = ()
    hf_architecture: str = "LlamaForCausalLM"
    key_meanings: dict[str, str] = {}
    """Config keys this family reads with a meaning of its own, {key: what the family builds from it}:
    a config of another model_type may mean something else by the same key (a port is told so)."""

    # ---- state dicts ----------------------------------------------------------------
    def layer_keys(self) -> dict[str, str]:
        """{native suffix: HF suffix} of the tensors of one layer, renamed one to one (LAYER_KEYS);
        extend it for a weight the family lacks (a post-norm, an extra projection)."""
        return LAYER_KEYS

    def to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF names (and layouts) for a native state dict.

        A native dict without `output.weight` is a tied model: `lm_head.weight` is emitted
        as the embedding tensor itself, which is what an HF model's own `state_dict()`
        holds (drop it before writing safetensors, as `save_pretrained` does; models/common/tied.py).
        """
        out: dict[str, torch.Tensor] = {}
        pending: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in sd.items():
            m = re.match(r"layers\.(\d+)\.(.+)", key)
            if m:
                pending.setdefault(int(m.group(1)), {})[m.group(2)] = value
            elif key in TOP_KEYS:
                out[TOP_KEYS[key]] = value
            else:
                raise AdapterError(f"no HF name for native key '{key}'")
        for i, entries in sorted(pending.items()):
            out.update(self.layer_group_to_hf(i, entries))
        return out if NATIVE_TIE.head in sd else with_tied_head(out, HF_TIE)

    def layer_group_to_hf(self, i: int, entries: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """All native tensors of layer i -> HF; families with fused HF tensors override this."""
        out: dict[str, torch.Tensor] = {}
        table = self.layer_keys()
        for suffix, value in entries.items():
            out.update(self.layer_to_hf(i, suffix, value, table))
        return out

    def layer_to_hf(self, i: int, suffix: str, value, table) -> dict[str, torch.Tensor]:
        """One native tensor `layers.{i}.{suffix}` -> HF, by `table` (layer_keys())."""
        if suffix not in table:
            raise AdapterError(f"no HF name for native key 'layers.{i}.{suffix}'")
        return {f"model.layers.{i}.{table[suffix]}": value}

    def from_hf(self, sd: dict[str, torch.Tensor], *, tie_embeddings: bool | None = None) -> dict[str, torch.Tensor]:
        """Native names (and layouts) for an HF state dict, in memory or as read from disk.

        `lm_head.weight` is dropped for a tied model: when `tie_embeddings` is True, or,
        left as None, when it is the embedding tensor itself (HF's in-memory tying).
        A tied checkpoint that stores a head differing from the embedding is an error
        (models/common/tied.py, `without_tied_head`).
        """
        out: dict[str, torch.Tensor] = {}
        inverse = {v: k for k, v in self.layer_keys().items()}
        top_inverse = {v: k for k, v in TOP_KEYS.items()}
        pending: dict[int, dict[str, torch.Tensor]] = {}
        sd = without_tied_head(sd, tie_embeddings, HF_TIE)
        for key, value in sd.items():
            m = re.match(r"model\.layers\.(\d+)\.(.+)", key)
            if key.endswith("rotary_emb.inv_freq"):
                continue  # a derived buffer some checkpoints carry (older ones once per layer)
            elif m:
                pending.setdefault(int(m.group(1)), {})[m.group(2)] = value
            elif key in top_inverse:
                out[top_inverse[key]] = value
            else:
                raise AdapterError(f"no native name for HF key '{key}'")
        for i, entries in sorted(pending.items()):
            out.update(self.layer_from_hf(i, entries, inverse))
        return out

    def layer_from_hf(self, i: int, entries: dict[str, torch.Tensor], inverse) -> dict[str, torch.Tensor]:
        """All HF tensors of layer i (keyed by the suffix after `model.layers.{i}.`) -> native
        `layers.{i}.*`; `inverse` is layer_keys() inverted. The inverse of layer_group_to_hf:
        a family with fused HF tensors pops them here and leaves the rest to this base."""
        out = {}
        for suffix, value in entries.items():
            if suffix not in inverse:
                raise AdapterError(f"no native name for HF key 'model.layers.{i}.{suffix}'")
            out[f"layers.{i}.{inverse[suffix]}"] = value
        return out

    # ---- configs --------------------------------------------------------------------
    def args_from_hf(self, cfg: dict[str, Any]) -> tuple[TransformerArgs, set[str]]:
        """Native args from an HF config dict, and the set of keys that were consumed.

        `take("a.b")` reads key b of the dict under key a and records "a.b", so nested
        settings (rope parameters) are accounted for one by one. Keys the caller sees as
        neither consumed nor neutral are what a port may be silently dropping. Every value
        read is checked against its rule (validate.HF_ACCEPTS: type, finiteness, range), so a
        wrong one is refused as ArchitectureError naming the key before anything uses it.
        """
        used: set[str] = set()

        def take(key: str, default: Any = None) -> Any:
            parent, _, child = key.partition(".")
            node = cfg.get(parent) if child else cfg
            name = child or key
            if isinstance(node, dict) and name in node:
                used.add(key)
                check_hf_value(key, node[name])
                return node[name]
            return default

        kw: dict[str, Any] = {f: take(HF_NAMES[f], default) for f, default in READ.items()}
        if kw["tie_embeddings"] is None:  # absent: what the config class of this model_type defaults to
            kw["tie_embeddings"] = tie_default(cfg.get("model_type"), self.hf_model_types)
        missing = [k for k in ("dim", "n_layers", "n_heads", "vocab_size") if kw[k] is None]
        if missing:
            raise AdapterError(f"config lacks required fields for {missing}")
        # The sizes first: the family's extras read them (range(num_hidden_layers)), and a
        # zero or a fraction must be named as such, not surface as a TypeError there.
        names, width_free = self.hf_names(cfg), self.width_free(cfg)
        check_args(kw, names=names, width_free=width_free)
        # not read into the args, but upstream's embedding takes it as its padding_idx
        check_pad_id(cfg.get("pad_token_id"), kw["vocab_size"])
        act = take("hidden_act", "silu")
        if act != "silu":
            raise AdapterError(f"hidden_act '{act}' is not supported (the families use SwiGLU with silu)")
        if take("mlp_bias", False):
            raise AdapterError("mlp_bias = true is not supported by this family")
        kw.update(self._rope_from_hf(cfg, take))
        kw.update(self.extra_args_from_hf(cfg, take))
        kw = {k: v for k, v in kw.items() if v is not None}
        check_args(kw, names=names, width_free=width_free)
        try:
            return TransformerArgs(**kw), used
        except (TypeError, ValueError) as e:
            raise AdapterError(f"config does not describe valid args: {e}") from None

    def _rope_from_hf(self, cfg, take) -> dict[str, Any]:
        # transformers 5 nests theta and scaling under rope_parameters; 4.x used a top-level
        # rope_theta plus an optional rope_scaling dict. Either may be present and null.
        take("rope_parameters")
        take("rope_scaling")
        nest = next((k for k in ("rope_parameters", "rope_scaling") if isinstance(cfg.get(k), dict)), None)

        def sub(key: str, default: Any = None) -> Any:
            return take(f"{nest}.{key}", default) if nest else default

        top_theta = take(HF_NAMES["rope_theta"])
        theta = sub("rope_theta")
        theta = theta if theta is not None else top_theta if top_theta is not None else 10000.0
        rope_type = sub("rope_type") or sub("type") or "default"
        partial = sub("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise AdapterError(f"partial_rotary_factor {partial} is not supported (RoPE covers the whole head)")
        scaling = None
        if rope_type == "llama3":
            names = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            scaling = {k: sub(k) for k in names}
            if None in scaling.values():
                raise AdapterError(f"llama3 rope scaling needs {names}; got {sorted(cfg[nest])}")
        elif rope_type != "default":
            raise AdapterError(f"rope_type '{rope_type}' is not supported (default and llama3 are)")
        return {"rope_theta": float(theta), "rope_scaling": scaling}

    def hf_names(self, cfg: dict[str, Any]) -> dict[str, str]:
        """{native field: HF key} of the fields read from `cfg`, so a structural error names
        the key the user wrote; families extend it with the keys their extras read."""
        return dict(HF_NAMES)

    def width_free(self, cfg: dict[str, Any]) -> bool:
        """Whether an explicit head_dim lets hidden_size differ from heads * head_dim, as the
        upstream class of `cfg` accepts it (Qwen3 does; LlamaConfig refuses it regardless)."""
        return True

    def extra_args_from_hf(self, cfg, take) -> dict[str, Any]:
        """Family-specific TransformerArgs fields (a port's own values go in `extra`); the
        base reads llama's attention_bias. `take(key, default)` reads and marks a key consumed."""
        bias = take("attention_bias", False)
        return {"qkv_bias": bias, "out_bias": bias}

    def hf_config(self, args: TransformerArgs) -> dict[str, Any]:
        """An HF config dict for exporting native weights."""
        rope: dict[str, Any] = {"rope_theta": args.rope_theta, "rope_type": "default"}
        if args.rope_scaling:
            rope = {**rope, **args.rope_scaling, "rope_type": "llama3"}
        sizes = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_hidden_dim", "norm_eps",
                 "max_seq_len", "tie_embeddings")  # fmt: skip
        return {
            "model_type": self.hf_model_types[0],
            "architectures": [self.hf_architecture],
            **{HF_NAMES[f]: getattr(args, f) for f in sizes},
            "rope_parameters": rope,
            "hidden_act": "silu",
            HF_NAMES["init_std"]: args.init_std,
        }

    def unconsumed_keys(self, cfg: dict[str, Any]) -> list[str]:
        """Config keys no field was read from: top-level ones, and `parent.key` entries of
        nested dicts (rope parameters) of which only some keys were read."""
        _, used = self.args_from_hf(cfg)
        left = [k for k in cfg if k not in used and k not in NEUTRAL_KEYS]
        for parent, node in cfg.items():
            if isinstance(node, dict) and any(u.startswith(parent + ".") for u in used):
                left += [f"{parent}.{k}" for k in node if f"{parent}.{k}" not in used]
        return sorted(left)


# ---- per-layer attention patterns ---------------------------------------------------
def window_pattern(windows: list[int | None]) -> tuple[int | None, int]:
    """(sliding_window, global_every) reproducing a per-layer list of windows (None = global).

    TransformerArgs expresses "every layer windowed" or "every g-th layer global, the rest
    windowed"; any other pattern (e.g. Qwen2's windowed suffix) is refused, never rounded.
    """
    sizes = {w for w in windows if w is not None}
    if not sizes:
        return None, 0
    if len(sizes) > 1:
        raise AdapterError(f"layers use different window sizes {sorted(sizes)}; one size is supported")
    window = sizes.pop()
    if None not in windows:
        return window, 0
    every = windows.index(None) + 1
    expected = [None if (i + 1) % every == 0 else window for i in range(len(windows))]
    if windows != expected:
        raise AdapterError(
            f"per-layer attention pattern {['global' if w is None else 'sliding' for w in windows]} is not "
            "'every layer windowed' nor 'every k-th layer global'; the native args cannot express it"
        )
    return window, every


def layer_types(args: TransformerArgs) -> list[str]:
    """HF `layer_types` for args: sliding_attention or full_attention per layer."""
    return ["full_attention" if args.layer_window(i) is None else "sliding_attention" for i in range(args.n_layers)]
