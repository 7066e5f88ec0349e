"""Architecture arguments: what every model's args answer (`ModelArgs`), and the shared decoder's (`TransformerArgs`).

A family of another kind has an args type of its own (flux: models/flux/args.py) that subclasses
`ModelArgs`, so the code around a model (the trainer's data, the memory model, the plans, the
tools that compare it with its upstream) asks its args what it is instead of which family it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from titan_core.models.common.kind import CAUSAL_LM, InitialLoss, ModelKind, SampleSpec

if TYPE_CHECKING:
    from titan_core.data.base import RowLoader


class ModelArgs:
    """The base of every model's args: the sizes and answers every caller may read of any model.

    Each args type defines the sizes (a field or a property), `kind`, `describe`, `sample_spec`,
    `initial_loss`, `own_samples` and `native_values`. The shared decoder's features below keep the
    values of a model without them unless the type holds its own: the memory model, the expert and
    pipeline plans and the FLOP count read them off any model's args.
    """

    kind: ClassVar[ModelKind]
    """What kind of model these args build (kind.py)."""
    derived: ClassVar[Mapping[str, str]] = MappingProxyType({})
    """{size: how it follows from the type's own fields} for the sizes a type computes instead of
    holding (flux's n_layers = n_double_layers + n_single_layers): an override of one is refused,
    naming the fields to change instead."""

    dim: int
    """Model (residual stream) width."""
    n_layers: int
    """Blocks in `TrainableModel.layers`."""
    n_heads: int
    """Query heads of an attention layer."""
    n_kv_heads: int
    """Key/value heads of an attention layer."""
    head_dim: int
    """Per-head width."""
    vocab_size: int
    """Width of the output each token is scored over (a causal LM's vocabulary)."""
    ffn_hidden_dim: int
    """Hidden width of a block's MLP."""
    max_seq_len: int
    """Longest sequence the model is used with."""
    rope_theta: float
    """RoPE base."""
    norm_eps: float
    """Epsilon of the norms."""
    init_std: float
    """Std of the normal init of projection weights."""

    n_experts: int = 0
    """Routed experts per MoE layer; 0: none."""
    top_k: int = 0
    """Experts chosen per token."""
    moe_hidden_dim: int = 0
    """Hidden width of each routed expert."""
    shared_expert_hidden_dim: int = 0
    """Hidden width of an always-on shared expert (0: none)."""
    aux_loss_coef: float = 0.0
    """Weight of the load-balancing loss added to the training loss."""
    qk_norm: bool = False
    """The shared decoder's per-head RMSNorm on queries and keys, as the memory model prices it."""
    final_softcap: float | None = None
    """Output logits soft-capped at this value (None: not capped)."""
    tie_embeddings: bool = False
    """The output head shares the token-embedding weight."""
    sliding_window: int | None = None
    """Attention window in tokens (None: none)."""
    extra: Mapping = MappingProxyType({})
    """Port-specific config values (TransformerArgs.extra); none for a type that holds every value it reads."""

    def layer_window(self, i: int) -> int | None:
        return None

    def layer_uses_rope(self, i: int) -> bool:
        return True

    def layer_is_moe(self, i: int) -> bool:
        return False

    def describe(self) -> str:
        """The architecture in one line, in the model's own terms (a README, a log line)."""
        raise NotImplementedError

    def sample_spec(self) -> SampleSpec:
        """What one batch of this model holds and how its `loss` and `forward` read it."""
        raise NotImplementedError

    def initial_loss(self) -> InitialLoss:
        """The loss a freshly initialised model starts near (a causal LM's ln(vocab))."""
        raise NotImplementedError

    def own_samples(
        self, *, seed: int, batch_size: int, seq_len: int, dp_rank: int = 0, dp_world: int = 1,
        repeat_batch: bool = False,
    ) -> RowLoader | None:  # fmt: skip
        """The loader of the samples the model trains on when it reads no token data (flux: synthetic
        rectified-flow samples), row g a function of (seed, g) as every loader's; None: data.source
        feeds it (text, data files or synthetic tokens)."""
        raise NotImplementedError

    def native_values(self) -> dict[str, Any]:
        """{TransformerArgs field: value} of what these args hold or derive: what the structural rules
        (models/common/validate.py's `validate_args`) judge, a derived size under its `derived` words."""
        raise NotImplementedError


@dataclass(kw_only=True)
class TransformerArgs(ModelArgs):
    """The shared decoder's args: every causal LM family, the transformers path and every port."""

    kind = CAUSAL_LM

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
    multipliers): a model.adapter_file's adapter fills it in `extra_args_from_hf` (`{"extra": {...}}`); overrides merge into it."""

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

    def describe(self) -> str:
        experts = f", {self.n_experts} experts top-{self.top_k}" if self.n_experts else ""
        heads = f"{self.n_heads} heads ({self.n_kv_heads} kv)"
        return f"dim {self.dim}, {self.n_layers} layers, {heads}, vocab {self.vocab_size}{experts}"

    def sample_spec(self) -> SampleSpec:
        return SampleSpec(tokens="token ids [batch, seq]")

    def initial_loss(self) -> InitialLoss:
        ln_vocab = math.log(self.vocab_size)
        return InitialLoss(ln_vocab, f"ln(vocab {self.vocab_size}), a uniform prediction",
                           {"vocab_size": self.vocab_size, "ln_vocab": ln_vocab})  # fmt: skip

    def own_samples(self, **_) -> None:
        return None

    def native_values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
