"""Qwen3-MoE: the Qwen3 decoder (QK-norm, explicit head_dim, GQA) with routed experts.

Each MoE layer has a softmax router over n_experts choosing top_k per token (optionally
renormalising the kept weights), experts behind one swappable module
(`layers.N.moe.experts`, reference = a plain per-expert loop), an optional always-on
shared expert, and a load-balancing auxiliary loss weighted by aux_loss_coef: one loss over
every MoE layer's tokens, as transformers' load_balancing_loss_func computes it (moe.py),
added only where the config's output_router_logits turns it on (the adapter sets the
coefficient to 0 otherwise). Layers listed in dense_layers, or off the moe_every stride,
keep a dense SwiGLU MLP.
"""

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.decoder import Transformer


class Qwen3Moe(Transformer):
    def __init__(self, args: TransformerArgs):
        if args.n_experts <= 0 or args.moe_hidden_dim <= 0:
            raise ValueError("qwen3_moe needs n_experts > 0 and moe_hidden_dim > 0 (use qwen3 for a dense model)")
        if not 0 < args.top_k <= args.n_experts:
            raise ValueError(f"top_k {args.top_k} must be in 1..n_experts ({args.n_experts})")
        if args.moe_every < 1:
            raise ValueError(f"moe_every {args.moe_every} must be >= 1")
        if not any(args.layer_is_moe(i) for i in range(args.n_layers)):
            raise ValueError("moe_every and dense_layers leave no MoE layer")
        if args.final_softcap or args.rope_skip_every or args.global_every:
            raise ValueError("qwen3_moe has no soft-capped head, RoPE skip or global/local layer pattern")
        super().__init__(args)
