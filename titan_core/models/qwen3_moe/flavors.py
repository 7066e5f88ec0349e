"""Qwen3-MoE sizes. `debugmodel` is the CPU test shape; 30B-A3B matches the published model
(30.5B total, 3.3B active parameters)."""

from titan_core.models.common.args import TransformerArgs

FLAVORS: dict[str, TransformerArgs] = {
    "debugmodel": TransformerArgs(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32, vocab_size=2048, ffn_hidden_dim=768,
        norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_seq_len=2048,
        n_experts=8, top_k=2, moe_hidden_dim=256, norm_topk_prob=True, aux_loss_coef=0.001,
    ),
    "30B-A3B": TransformerArgs(
        dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, vocab_size=151936, ffn_hidden_dim=6144,
        norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_seq_len=40960,
        n_experts=128, top_k=8, moe_hidden_dim=768, norm_topk_prob=True,
    ),
    # 235.1B total, 22.2B active; ffn_hidden_dim is the config's unused dense width (every layer is MoE)
    "235B-A22B": TransformerArgs(
        dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128, vocab_size=151936, ffn_hidden_dim=12288,
        norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True, max_seq_len=40960,
        n_experts=128, top_k=8, moe_hidden_dim=1536, norm_topk_prob=True,
    ),
}  # fmt: skip
