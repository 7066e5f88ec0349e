"""Glimmer sizes. `debugmodel` is the CPU test shape (8 layers, so the 3-local / 1-global
pattern shows twice); the others are the sizes we train (totals from stats.param_counts)."""

from titan_core.models.common.args import TransformerArgs

FLAVORS: dict[str, TransformerArgs] = {
    "debugmodel": TransformerArgs(
        dim=256, n_layers=8, n_heads=8, n_kv_heads=2, head_dim=32, vocab_size=4096, ffn_hidden_dim=768,
        norm_eps=1e-6, rope_theta=10000.0, qk_norm=True, tie_embeddings=True, max_seq_len=2048,
        sliding_window=64, global_every=4, rope_skip_every=4, final_softcap=30.0,
    ),
    # 2.0B total (0.54B of it the tied embedding)
    "2B": TransformerArgs(
        dim=2048, n_layers=24, n_heads=16, n_kv_heads=2, head_dim=128, vocab_size=262144, ffn_hidden_dim=8192,
        norm_eps=1e-6, rope_theta=50000.0, qk_norm=True, tie_embeddings=True, max_seq_len=131072,
        sliding_window=1024, global_every=4, rope_skip_every=4, final_softcap=30.0,
    ),
    # 7.9B total (1.07B of it the tied embedding)
    "8B": TransformerArgs(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=4, head_dim=128, vocab_size=262144, ffn_hidden_dim=14336,
        norm_eps=1e-6, rope_theta=50000.0, qk_norm=True, tie_embeddings=True, max_seq_len=131072,
        sliding_window=4096, global_every=4, rope_skip_every=4, final_softcap=30.0,
    ),
}  # fmt: skip
