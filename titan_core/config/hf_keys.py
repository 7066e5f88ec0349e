"""The HF config keys behind each native field: one table for everything that reads or writes a config.json.

    HF_KEYS["n_experts"]            # ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    hf_key("n_experts", cfg)        # the one of them `cfg` uses, e.g. "n_routed_experts" for DeepSeek-V3

Each entry lists the names configs give one quantity: first the name titan_core's families read and
write, then the other names transformers' config classes use for it (GPT-2's `n_embd`, Mixtral's
`num_local_experts`, DeepSeek's `n_routed_experts`). The families' adapters read and export the
first names (titan_core/models/common/hf_adapter.py), the transformers path finds a count under any of them
(titan_core/models/transformers/adapter.py), the header check finds the declared dtype by them
(titan_core/weights/header_check.py), and a small config derived from a real one writes each shrunk size
under the name the real one uses, so the class that reads it sees the new value and no second key.

Keys are TransformerArgs fields, but for `dtype`: the checkpoint's declared dtype, which no args
field holds (transformers 5 writes `dtype`, 4.x wrote `torch_dtype`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HF_KEYS: dict[str, tuple[str, ...]] = {
    "dim": ("hidden_size", "n_embd", "d_model", "n_embed", "emb_dim", "embedding_dim"),
    "n_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "num_decoder_layers"),
    "n_heads": ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
                "attention_heads", "num_decoder_attention_heads"),
    "n_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "kv_channels", "d_head", "dim_head", "attention_head_size", "attention_head_dim"),
    "vocab_size": ("vocab_size",),
    "ffn_hidden_dim": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "decoder_ffn_dim", "d_ff",
                       "dim_ff", "dff"),
    "norm_eps": ("rms_norm_eps", "layer_norm_eps", "norm_eps"),
    "max_seq_len": ("max_position_embeddings", "n_positions", "n_ctx", "max_target_positions"),
    "rope_theta": ("rope_theta",),
    "tie_embeddings": ("tie_word_embeddings",),
    "init_std": ("initializer_range",),
    "sliding_window": ("sliding_window", "sliding_window_size", "attention_window_size"),
    "n_experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "top_k": ("num_experts_per_tok", "top_k_experts", "moe_topk", "moe_k"),
    "moe_hidden_dim": ("moe_intermediate_size", "expert_ffn_hidden_size"),
    "shared_expert_hidden_dim": ("shared_expert_intermediate_size", "shared_experts_intermediate_size",
                                 "moe_shared_expert_intermediate_size"),
    "dtype": ("dtype", "torch_dtype"),
}  # fmt: skip
"""{native field: the config keys that carry it}, the name titan_core reads and writes first."""

ARG_FIELDS = tuple(f for f in HF_KEYS if f != "dtype")
"""The table's keys that are TransformerArgs fields (all but `dtype`; a test holds them to the dataclass).
Named, not read off TransformerArgs, so the table loads without torch (a light reader shows a config's shape by it)."""


def hf_key(field: str, cfg: Mapping[str, Any] | None = None) -> str:
    """The key `cfg` writes `field` under: the first of its names holding a value, else the first
    present (a null `head_dim`), else the first name (what titan_core writes)."""
    names = HF_KEYS[field]
    if cfg:
        present = [k for k in names if k in cfg]
        return next((k for k in present if cfg[k] is not None), present[0] if present else names[0])
    return names[0]


def names_in(cfg: Mapping[str, Any]) -> dict[str, str]:
    """{args field: the key `cfg` writes it under} (`hf_key`)."""
    return {f: hf_key(f, cfg) for f in ARG_FIELDS}
