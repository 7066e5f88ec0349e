"""Qwen3 / Qwen2 sizes. The debug models are the CPU test shapes; the rest match published models.

Published sizes (total parameters): Qwen3-0.6B 0.60B (tied), Qwen3-8B 8.19B,
Qwen2.5-7B 7.62B (q/k/v bias, no QK-norm).
"""

from titan_core.models.common.args import TransformerArgs

FLAVORS: dict[str, TransformerArgs] = {
    # head_dim is explicit and n_heads * head_dim != dim, as in the real Qwen3 models
    "debugmodel": TransformerArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, vocab_size=2048, ffn_hidden_dim=768,
        norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_seq_len=2048,
    ),
    "debugmodel_qwen2": TransformerArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=2048, ffn_hidden_dim=768,
        norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True, max_seq_len=2048,
    ),
    "0.6B": TransformerArgs(
        dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, vocab_size=151936, ffn_hidden_dim=3072,
        norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, tie_embeddings=True, max_seq_len=40960,
    ),
    "8B": TransformerArgs(
        dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, vocab_size=151936, ffn_hidden_dim=12288,
        norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_seq_len=40960,
    ),
    "32B": TransformerArgs(
        dim=5120, n_layers=64, n_heads=64, n_kv_heads=8, head_dim=128, vocab_size=151936, ffn_hidden_dim=25600,
        norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_seq_len=40960,
    ),
    "qwen2.5-7B": TransformerArgs(
        dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, vocab_size=152064, ffn_hidden_dim=18944,
        norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True, max_seq_len=32768,
    ),
}  # fmt: skip
