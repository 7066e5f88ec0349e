"""Llama 3: GQA, RoPE with llama3 frequency scaling, SwiGLU, RMSNorm.

Optional tied embeddings, and an optional sliding window on every layer, which makes it
Mistral. The layers themselves live in models/common; this family is their plainest use.
"""

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.decoder import Transformer


class Llama3(Transformer):
    def __init__(self, args: TransformerArgs):
        if args.qk_norm or args.n_experts or args.final_softcap or args.rope_skip_every:
            raise ValueError("llama3 has no QK-norm, experts, soft-cap or RoPE skip; pick another family")
        super().__init__(args)
