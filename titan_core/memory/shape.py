"""What the memory model knows of one model: counts from the meta build, widths from its args.

    shape = ModelShape.from_model(meta_model, args)
    shape.block_params, shape.expert_params, shape.embed_params, shape.head_params
    tp_local(shape, tp)      # the widths one tensor-parallel rank computes with

Pure data: nothing here imports torch at module level (reports format sizes without loading it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about one model."""

    params: int
    """Distinct parameters of the built model (a tied embedding counts once)."""
    largest_param: int
    """Elements of the largest single parameter (the fp64 norm of clipping copies one at a time)."""
    largest_block_params: int
    """Parameters of the largest decoder block."""
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    ffn_hidden_dim: int
    layer_mix: tuple[tuple[bool, bool, int], ...] = ()
    """(is an MoE layer, rotates q and k, how many layers) per kind of layer; empty: all dense with RoPE."""
    n_experts: int = 0
    top_k: int = 0
    moe_hidden_dim: int = 0
    shared_expert_hidden_dim: int = 0
    qk_norm: bool = False
    final_softcap: bool = False
    scores_pinned: bool = False
    """Attention layers keep the naive core whatever kernels.attention says (soft-capped scores, Gemma-2's
    attn_logit_softcapping, which no fused kernel takes): their [heads, seq, seq] scores exist."""
    outside_blocks: int = 0
    """Parameters outside the decoder blocks (embeddings, output head, final norm)."""
    expert_params: int = -1
    """Parameters of every block's routed experts (0 for a dense model; -1: derive from the widths, as the
    common MoE block builds them: w1, w2, w3 of dim x moe_hidden_dim per expert in each MoE layer)."""
    tied: bool | None = None
    """The output head is the embedding (None: tied when the parameters outside the blocks hold one
    vocab x dim table only)."""
    lora_params: int = -1
    """[lora]: parameters of the adapters and of the saved modules' copies, beside the frozen base: they
    alone hold gradients and AdamW state (-1: no LoRA, every parameter trains)."""

    def __post_init__(self) -> None:
        if not self.layer_mix:
            object.__setattr__(self, "layer_mix", ((False, True, self.n_layers),))
        if self.expert_params < 0:
            derived = self.moe_layers * self.n_experts * 3 * self.dim * self.moe_hidden_dim
            object.__setattr__(self, "expert_params", derived)
        if self.tied is None:
            object.__setattr__(self, "tied", self.outside_blocks < 2 * self.vocab_size * self.dim)

    @property
    def moe_layers(self) -> int:
        return sum(n for moe, _, n in self.layer_mix if moe)

    @property
    def is_moe(self) -> bool:
        return self.expert_params > 0

    @property
    def block_params(self) -> int:
        """Parameters of every decoder block outside the routed experts (attention, norms, router, dense or
        shared MLP)."""
        return self.params - self.outside_blocks - self.expert_params

    @property
    def embed_params(self) -> int:
        return min(self.outside_blocks, self.vocab_size * self.dim)

    @property
    def head_params(self) -> int:
        """The output head's parameters (0 when tied to the embedding)."""
        return 0 if self.tied else min(self.outside_blocks - self.embed_params, self.vocab_size * self.dim)

    @property
    def other_params(self) -> int:
        """Outside the blocks, neither embedding nor head (the final norm): whole on every TP rank."""
        return self.outside_blocks - self.embed_params - self.head_params

    @classmethod
    def from_model(cls, model: TrainableModel, args) -> ModelShape:
        """Counts from the (meta) model itself, widths from its TransformerArgs; each block's routed experts
        are its modules' `experts` children (titan_core/models/common/param_counts.py's rule)."""
        from torch import nn  # lazy: torch; this module is pure data (module docstring)

        from titan_core.models.common.param_counts import EXPERTS_CHILD  # lazy: imports torch, as above

        params = list(model.parameters())  # distinct: a tied weight appears once
        blocks = list(model.layers.values())
        per_block = [sum(p.numel() for p in b.parameters()) for b in blocks]
        routed: dict[int, int] = {}  # by identity: a container nested in another is counted once
        for block in blocks:
            for module in block.modules():
                child = getattr(module, EXPERTS_CHILD, None)
                if isinstance(child, nn.Module):
                    routed.update((id(p), p.numel()) for p in child.parameters())
        kinds = [(args.layer_is_moe(i), args.layer_uses_rope(i)) for i in range(args.n_layers)]
        mix = tuple((moe, rope, kinds.count((moe, rope))) for moe, rope in sorted(set(kinds)))
        return cls(
            params=sum(p.numel() for p in params),
            largest_param=max((p.numel() for p in params), default=0),
            largest_block_params=max(per_block, default=0),
            outside_blocks=sum(p.numel() for p in params) - sum(per_block),
            dim=args.dim,
            n_layers=args.n_layers,
            n_heads=args.n_heads,
            n_kv_heads=args.n_kv_heads,
            head_dim=args.head_dim,
            vocab_size=args.vocab_size,
            ffn_hidden_dim=args.ffn_hidden_dim,
            layer_mix=mix,
            n_experts=args.n_experts,
            top_k=args.top_k,
            moe_hidden_dim=args.moe_hidden_dim,
            shared_expert_hidden_dim=args.shared_expert_hidden_dim,
            qk_norm=args.qk_norm,
            final_softcap=bool(args.final_softcap),
            scores_pinned=bool(getattr(model, "attention_pinned_naive", False)),
            expert_params=sum(routed.values()),
            tied=bool(args.tie_embeddings),
        )


def tp_local(m: ModelShape, tp: int) -> ModelShape:
    """The widths one TP rank computes with: 1/tp of the query and key/value heads, of the MLP
    hidden units and of the vocabulary (the dense decoder's TP plan, parallel/plans.py); the rest
    stays whole."""
    if tp <= 1:
        return m
    return replace(
        m,
        n_heads=max(1, m.n_heads // tp),
        n_kv_heads=max(1, m.n_kv_heads // tp),
        ffn_hidden_dim=max(1, m.ffn_hidden_dim // tp),
        vocab_size=-(-m.vocab_size // tp),
    )


def tp_whole(m: ModelShape) -> int:
    """Parameters outside the blocks that a TP plan leaves whole on every TP rank: all but the
    vocab x dim tables (the embedding, and the head unless tied), which it splits by vocabulary."""
    return m.other_params
