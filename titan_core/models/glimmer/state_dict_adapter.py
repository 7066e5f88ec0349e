"""HF-style export for glimmer: llama key names plus config fields for what llama lacks.

There is no upstream class; `hf_config` writes `model_type = "glimmer"` with the
per-layer pattern as `layer_types` (sliding_attention / full_attention) and
`sliding_window`, the RoPE skip as `no_rope_layer_interval`, the logit cap as
`final_logit_softcapping` and QK-norm as `use_qk_norm`; `args_from_hf` reads them back.
"""

from __future__ import annotations

from titan_core.models.common.hf_adapter import AdapterError, HFAdapter, layer_types, window_pattern
from titan_core.models.common.mapping_errors import ArchitectureError
from titan_core.models.common.validate import WINDOW, refusal


class GlimmerAdapter(HFAdapter):
    hf_model_types = ("glimmer",)
    hf_architecture = "GlimmerForCausalLM"
    key_meanings = {
        "use_qk_norm": "an RMSNorm with a learned [head_dim] weight on each head of q and of k, before RoPE, "
        "on every layer (titan_core's Attention q_norm / k_norm); Llama-4 means an L2 norm without weight "
        "after RoPE on its RoPE layers, Cohere a LayerNorm with a weight per head",
    }

    def hf_names(self, cfg):
        names = {"sliding_window": "sliding_window", "rope_skip_every": "no_rope_layer_interval"}
        return {**super().hf_names(cfg), **names}

    def extra_args_from_hf(self, cfg, take):
        n_layers = cfg["num_hidden_layers"]
        window = take("sliding_window")
        types = take("layer_types")
        if types is None:
            types = ["sliding_attention" if window else "full_attention"] * n_layers
        if len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
            raise AdapterError(f"layer_types must list sliding_attention/full_attention for {n_layers} layers")
        if "sliding_attention" in types and window == 0:  # a window of no tokens, where layers slide
            raise ArchitectureError(refusal("sliding_window", window, WINDOW.text), ("sliding_window",))
        if "sliding_attention" in types and not window:
            raise AdapterError("layer_types has sliding_attention layers but sliding_window is not set")
        sliding_window, global_every = window_pattern([window if t == "sliding_attention" else None for t in types])
        bias = take("attention_bias", False)
        return {
            "sliding_window": sliding_window,
            "global_every": global_every,
            "rope_skip_every": take("no_rope_layer_interval", 0),
            "final_softcap": take("final_logit_softcapping"),
            "qk_norm": take("use_qk_norm", False),
            "qkv_bias": bias,
            "out_bias": bias,
        }

    def hf_config(self, args):
        if args.qkv_bias != args.out_bias:
            raise AdapterError("glimmer's attention_bias covers q, k, v and o together; args set them differently")
        cfg = super().hf_config(args)
        cfg.update(
            sliding_window=args.sliding_window,
            layer_types=layer_types(args),
            no_rope_layer_interval=args.rope_skip_every,
            final_logit_softcapping=args.final_softcap,
            use_qk_norm=args.qk_norm,
            attention_bias=args.qkv_bias,
        )
        return cfg
