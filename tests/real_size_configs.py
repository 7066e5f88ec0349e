"""Published config.json files of real-size models, one copy for every test that needs them.

The architecture fields of the released models' config.json (written out from the released
files; token ids and other non-architecture keys are kept where they appear, so
`unconsumed_keys` sees what a user's file holds). Llama 8B/70B are the 3.1 releases (the 3.0
ones differ only in RoPE scaling and context length, not in parameters).
"""

LLAMA31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}  # fmt: skip
LLAMA_COMMON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "initializer_range": 0.02,
    "max_position_embeddings": 131072, "mlp_bias": False, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": LLAMA31_ROPE, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256,
}  # fmt: skip
QWEN3_COMMON = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "initializer_range": 0.02,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
QWEN3_MOE_COMMON = {
    **QWEN3_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "num_experts": 128, "num_experts_per_tok": 8,
    "output_router_logits": False, "router_aux_loss_coef": 0.001,
}  # fmt: skip

# name: (family, flavor, published config.json)
PUBLISHED = {
    "Llama-3.2-1B": ("llama3", "1B", {
        **LLAMA_COMMON, "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
        "num_hidden_layers": 16, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
        "rope_scaling": {**LLAMA31_ROPE, "factor": 32.0},
    }),
    "Llama-3.1-8B": ("llama3", "8B", {
        **LLAMA_COMMON, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8,
    }),
    "Llama-3.1-70B": ("llama3", "70B", {
        **LLAMA_COMMON, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
        "num_hidden_layers": 80, "num_key_value_heads": 8,
    }),
    "Llama-3.1-405B": ("llama3", "405B", {
        **LLAMA_COMMON, "hidden_size": 16384, "intermediate_size": 53248, "num_attention_heads": 128,
        "num_hidden_layers": 126, "num_key_value_heads": 8,
    }),
    "Mistral-7B-v0.1": ("llama3", "mistral-7B", {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32000,
    }),
    "Qwen3-0.6B": ("qwen3", "0.6B", {
        **QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
        "num_hidden_layers": 28, "num_key_value_heads": 8, "max_window_layers": 28, "tie_word_embeddings": True,
    }),
    "Qwen3-8B": ("qwen3", "8B", {
        **QWEN3_COMMON, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
        "num_hidden_layers": 36, "num_key_value_heads": 8, "max_window_layers": 36,
    }),
    "Qwen3-32B": ("qwen3", "32B", {
        **QWEN3_COMMON, "hidden_size": 5120, "intermediate_size": 25600, "num_attention_heads": 64,
        "num_hidden_layers": 64, "num_key_value_heads": 8, "max_window_layers": 64,
    }),
    "Qwen2.5-7B": ("qwen3", "qwen2.5-7B", {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
        "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
        "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
    }),
    "Qwen3-30B-A3B": ("qwen3_moe", "30B-A3B", {
        **QWEN3_MOE_COMMON, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4, "max_window_layers": 48,
    }),
    "Qwen3-235B-A22B": ("qwen3_moe", "235B-A22B", {
        **QWEN3_MOE_COMMON, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_attention_heads": 64, "num_hidden_layers": 94, "num_key_value_heads": 4, "max_window_layers": 94,
    }),
}  # fmt: skip

MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096, "head_dim": None,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}  # fmt: skip
"""Mixtral-8x7B's config.json (architecture keys), head_dim null as its file has it."""
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584, "head_dim": 256,
    "intermediate_size": 14336, "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 42,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "vocab_size": 256000, "bos_token_id": 2,
    "eos_token_id": 1, "pad_token_id": 0,
}  # fmt: skip
"""Gemma-2-9B's config.json (architecture keys): alternating sliding and global layers, soft-capped scores."""
