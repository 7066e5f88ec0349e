"""HF <-> native for Qwen3ForCausalLM and Qwen2ForCausalLM (llama key names plus q_norm/k_norm)."""

from __future__ import annotations

from typing import Any

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.hf_adapter import AdapterError, HFAdapter, layer_types, window_pattern


def qwen_windows(take, n_layers: int) -> list[int | None]:
    """Per-layer windows the way transformers 5 reads a Qwen2/Qwen3 config.

    The window is live only with use_sliding_window; layer_types (written by every v5
    config) decides per layer, else layers from max_window_layers on are windowed.
    """
    use = take("use_sliding_window", False)
    window = take("sliding_window")
    first_windowed = take("max_window_layers", n_layers)
    types = take("layer_types")
    if not use or window is None:
        window = None
    if types is None:
        windowed = [window is not None and i >= first_windowed for i in range(n_layers)]
        types = ["sliding_attention" if w else "full_attention" for w in windowed]
    if len(types) != n_layers:
        raise AdapterError(f"layer_types has {len(types)} entries for {n_layers} layers")
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise AdapterError(f"layer_types {sorted(unknown)} are not supported")
    return [window if t == "sliding_attention" else None for t in types]


def qwen_window_config(args: TransformerArgs) -> dict[str, Any]:
    """The sliding-window fields of a Qwen2/Qwen3 HF config for args."""
    return {
        "use_sliding_window": bool(args.sliding_window),
        "sliding_window": args.sliding_window,
        "max_window_layers": args.n_layers,
        "layer_types": layer_types(args),
    }


class Qwen3Adapter(HFAdapter):
    hf_model_types = ("qwen3", "qwen2")
    hf_architecture = "Qwen3ForCausalLM"

    def hf_names(self, cfg):
        return {**super().hf_names(cfg), "sliding_window": "sliding_window"}

    def extra_args_from_hf(self, cfg, take):
        sliding_window, global_every = window_pattern(qwen_windows(take, cfg["num_hidden_layers"]))
        kw: dict[str, Any] = {"sliding_window": sliding_window, "global_every": global_every}
        if cfg.get("model_type") == "qwen2":
            # Qwen2 hard-codes biases on q, k, v (not o) and has no QK-norm
            return {**kw, "qkv_bias": True, "out_bias": False, "qk_norm": False}
        bias = take("attention_bias", False)
        return {**kw, "qkv_bias": bias, "out_bias": bias, "qk_norm": True}

    def hf_config(self, args):
        cfg = super().hf_config(args)
        cfg.update(qwen_window_config(args))
        if args.qk_norm:
            if args.qkv_bias != args.out_bias:
                raise AdapterError("Qwen3's attention_bias covers q, k, v and o together; args set them differently")
            cfg["attention_bias"] = args.qkv_bias
            return cfg
        if not (args.qkv_bias and not args.out_bias):
            raise AdapterError("without QK-norm this family exports as Qwen2, which has q/k/v biases and no o bias")
        cfg.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
        del cfg["head_dim"]  # Qwen2 derives it as hidden_size // num_attention_heads
        if args.head_dim != args.dim // args.n_heads:
            raise AdapterError("Qwen2 derives head_dim as dim // n_heads; args set another head_dim")
        return cfg
