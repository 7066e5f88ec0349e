"""Qwen3 (and Qwen2): a llama-style decoder with two distinguishing options.

Qwen3 normalises every query and key head with its own RMSNorm before RoPE (QK-norm) and
sets head_dim explicitly (n_heads * head_dim need not equal dim). Qwen2 instead puts a
bias on the q, k and v projections and has no QK-norm. Everything else (GQA, SwiGLU,
RMSNorm, plain RoPE, optional tied embeddings, the HF configs' optional sliding window
per layer) is the shared decoder.
"""

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.decoder import Transformer


class Qwen3(Transformer):
    def __init__(self, args: TransformerArgs):
        if args.n_experts:
            raise ValueError("qwen3 is dense; use the qwen3_moe family for experts")
        if args.final_softcap or args.rope_skip_every:
            raise ValueError("qwen3 has no soft-capped head or RoPE skip (see glimmer)")
        if args.out_bias and not args.qkv_bias:
            raise ValueError("qwen3 puts a bias on the output projection only together with q/k/v biases")
        super().__init__(args)
