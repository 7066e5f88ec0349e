"""Llama 3 sizes. `debugmodel` is the CPU test shape; the others match published models."""

from titan_core.models.common.args import TransformerArgs

LLAMA3_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

FLAVORS: dict[str, TransformerArgs] = {
    "debugmodel": TransformerArgs(
        dim=256, n_layers=6, n_heads=16, n_kv_heads=4, vocab_size=2048, ffn_hidden_dim=768,
        rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING, max_seq_len=131072,
    ),
    "debugmodel_mistral": TransformerArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=2048, ffn_hidden_dim=768,
        rope_theta=1000000.0, sliding_window=64, max_seq_len=2048,
    ),
    "1B": TransformerArgs(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_hidden_dim=8192,
        rope_theta=500000.0, rope_scaling={**LLAMA3_ROPE_SCALING, "factor": 32.0},
        tie_embeddings=True, max_seq_len=131072,
    ),
    "8B": TransformerArgs(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_hidden_dim=14336,
        rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING, max_seq_len=131072,
    ),
    "70B": TransformerArgs(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256, ffn_hidden_dim=28672,
        rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING, max_seq_len=131072,
    ),
    # Llama 3.1 405B: 405,853,388,800 parameters (what LlamaForCausalLM builds from its config)
    "405B": TransformerArgs(
        dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, vocab_size=128256, ffn_hidden_dim=53248,
        rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_SCALING, max_seq_len=131072,
    ),
    "mistral-7B": TransformerArgs(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=32000, ffn_hidden_dim=14336,
        rope_theta=10000.0, sliding_window=4096, max_seq_len=32768,
    ),
}  # fmt: skip
