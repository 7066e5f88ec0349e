"""Glimmer: our own modern dense decoder (no upstream HF class).

What sets it apart from llama3: most layers attend through a sliding window with RoPE,
while every `global_every`-th layer attends to the whole causal prefix; RoPE is skipped
on every `rope_skip_every`-th layer (with both at 4, the global layers are the NoPE
layers, as in Command A / Llama 4: local layers carry position, global ones generalise
past the trained length); the output logits are soft-capped (`cap * tanh(x / cap)`);
QK-norm, few KV heads and a large tied vocabulary.
"""

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.decoder import Transformer


class Glimmer(Transformer):
    def __init__(self, args: TransformerArgs):
        if args.n_experts:
            raise ValueError("glimmer is dense; use qwen3_moe for experts")
        if args.global_every and not args.sliding_window:
            raise ValueError("global_every picks global layers among windowed ones; set sliding_window too")
        if args.global_every < 0 or args.rope_skip_every < 0:
            raise ValueError("global_every and rope_skip_every count layers and must be >= 0")
        if args.final_softcap is not None and args.final_softcap <= 0:
            raise ValueError(f"final_softcap must be positive (or None), got {args.final_softcap}")
        super().__init__(args)
