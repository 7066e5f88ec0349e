"""Architecture arguments shared by every decoder family."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class TransformerArgs:
    dim: int = 256
    """Model (residual stream) width."""
    n_layers: int = 6
    """Number of decoder blocks."""
    n_heads: int = 16
    """Query heads."""
    n_kv_heads: int | None = None
    """Key/value heads (GQA); None means n_heads."""
    head_dim: int | None = None
    """Per-head width; None means dim // n_heads."""
    vocab_size: int = 2048
    """Vocabulary size of the embedding and output head."""
    ffn_hidden_dim: int = 768
    """Hidden width of the SwiGLU MLP."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (all norms, QK-norm included)."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rope_scaling: dict | None = None
    """llama3 long-context scaling: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings."""
    rope_skip_every: int = 0
    """When > 0, layers i with (i + 1) % rope_skip_every == 0 use no positional rotation."""
    max_seq_len: int = 2048
    """Longest sequence the model is used with (informational for RoPE and FLOPs)."""
    tie_embeddings: bool = False
    """Output head shares the token-embedding weight."""
    qkv_bias: bool = False
    """Bias on the q, k and v projections (qwen2)."""
    out_bias: bool = False
    """Bias on the attention output projection (llama's attention_bias sets both)."""
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys before RoPE (qwen3)."""
    sliding_window: int | None = None
    """Attention window in tokens (query included); None attends to the whole causal prefix."""
    global_every: int = 0
    """With a window: layers i with (i + 1) % global_every == 0 attend globally (0: all windowed)."""
    final_softcap: float | None = None
    """Output logits become tanh(logits / cap) * cap."""
    n_experts: int = 0
    """Routed experts per MoE layer; 0 makes every layer dense."""
    top_k: int = 2
    """Experts chosen per token."""
    moe_hidden_dim: int = 0
    """Hidden width of each expert's SwiGLU."""
    norm_topk_prob: bool = True
    """Renormalise the kept top-k router probabilities to sum to one."""
    shared_expert_hidden_dim: int = 0
    """Hidden width of an always-on shared expert (0: none)."""
    moe_every: int = 1
    """Layers i with (i + 1) % moe_every == 0 are MoE (when n_experts > 0)."""
    dense_layers: list[int] = field(default_factory=list)
    """Layer indices forced dense in an MoE model."""
    aux_loss_coef: float = 0.0
    """Weight of the load-balancing loss added to the training loss."""
    init_std: float = 0.02
    """Std of the normal init of projection and embedding weights."""
    extra: dict = field(default_factory=dict)
    """Port-specific config values the family classes ignore and a port's `build_model(args)` reads (e.g. Granite's
    multipliers): a workspace adapter fills it in `extra_args_from_hf` (`{"extra": {...}}`); overrides merge into it."""

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_heads

    def layer_window(self, i: int) -> int | None:
        if not self.sliding_window:
            return None
        if self.global_every and (i + 1) % self.global_every == 0:
            return None
        return self.sliding_window

    def layer_uses_rope(self, i: int) -> bool:
        return not (self.rope_skip_every and (i + 1) % self.rope_skip_every == 0)

    def layer_is_moe(self, i: int) -> bool:
        return self.n_experts > 0 and (i + 1) % self.moe_every == 0 and i not in self.dense_layers
