"""A SmolLM3 port written the way an agent writes one, for the planted-bug parity tests
(no test here; imported by test_parity_plants.py).

SmolLM3 is Llama with NoPE layers: `no_rope_layers` holds one entry per layer, 1 where the
layer rotates q and k with RoPE and 0 where it uses no positional encoding at all (SmolLM3-3B
drops RoPE on every 4th layer). `new-model --path port` on a SmolLM3 config starts from qwen3
(its adapter reads the most keys); the agent replaces model.py with PORT_MODEL, on titan_core's
shared Attention (whose `use_rope` is per layer) and FeedForward, and adds ADAPTER_METHODS to
adapter.py: no QK-norm (the qwen3 adapter sets it), and in `args.extra` the pad id and the
per-layer list, which TransformerArgs' `rope_skip_every` ("every k-th layer") cannot always say.

The tiny config has two layers, [1, 0]: one of each kind, the NoPE one last, as SmolLM3 has them.
"""

from __future__ import annotations

from pathlib import Path

PORT_MODEL = '''"""SmolLM3 on titan_core's shared layers: a Llama decoder whose NoPE layers skip RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.attention import Attention
from titan_core.models.common.layers import CrossEntropyHead, FeedForward, RMSNorm, rope_cos_sin, rope_inv_freq
from titan_core.models.common.protocol import ModelBase


class Block(nn.Module):
    """Pre-norm Llama block. `no_rope_layers[i]` is 1 where layer i applies RoPE, 0 on a NoPE layer."""

    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(
            args.dim, args.n_heads, args.n_kv_heads, args.head_dim, qkv_bias=args.qkv_bias, out_bias=args.out_bias,
            use_rope=bool(args.extra["no_rope_layers"][i]),
        )  # fmt: skip
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Model(ModelBase):
    """Embedding, blocks, final norm, output head (SmolLM3 ties it to the embedding)."""

    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, padding_idx=args.extra["pad_token_id"])
        self.layers = nn.ModuleDict({str(i): Block(args, i) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        self.loss_head = CrossEntropyHead()
        inv_freq = rope_inv_freq(args.head_dim, args.rope_theta, args.rope_scaling)  # llama3 scaling where set
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def output_weight(self):
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    @torch.no_grad()
    def init_weights(self, seed=None):
        """Upstream's init: norm weights 1, every other weight normal(0, initializer_range), the pad row 0."""
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.rpartition(".")[0].endswith("norm"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, self.args.init_std, generator=gen)
        if self.tok_embeddings.padding_idx is not None:  # upstream zeroes the pad row, as nn.Embedding does
            self.tok_embeddings.weight[self.tok_embeddings.padding_idx].zero_()
        self.inv_freq.copy_(rope_inv_freq(self.args.head_dim, self.args.rope_theta, self.args.rope_scaling))

    def hidden(self, tokens):
        h = self.tok_embeddings(tokens)
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)  # computed once; NoPE layers ignore them
        for block in self.layers.values():
            h = block(h, cos, sin)
        return self.norm(h)

    def forward(self, tokens):
        return F.linear(self.hidden(tokens), self.output_weight)

    def loss(self, tokens, labels):
        ce = self.loss_head(self.hidden(tokens), self.output_weight, labels)
        return ce, ce


def build_model(args: TransformerArgs) -> Model:
    return Model(args)
'''

ADAPTER_METHODS = '''
def extra_args_from_hf(self, cfg, take):
    """SmolLM3 has no QK-norm (the qwen3 adapter sets one), a per-layer RoPE switch and a pad id (args.extra)."""
    from titan_core.models.common.hf_adapter import AdapterError

    kw = super().extra_args_from_hf(cfg, take)
    if kw["sliding_window"]:
        raise AdapterError("SmolLM3 with use_sliding_window is not ported (this port attends globally)")
    n = cfg["num_hidden_layers"]
    # the interval only derives no_rope_layers where a config lacks the list; the list decides
    interval = take("no_rope_layer_interval", 4)
    no_rope = take("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(no_rope) != n or set(no_rope) - {0, 1}:
        raise AdapterError(f"no_rope_layers must hold a 0 or 1 per layer ({n}), got {no_rope}")
    extra = {"no_rope_layers": [int(v) for v in no_rope], "pad_token_id": take("pad_token_id")}
    return {**kw, "qk_norm": False, "extra": extra}
'''

# no token ids: SmolLM3's own (pad 128004, ...) lie outside a 256-token vocabulary
CONFIG = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
    vocab_size=256, no_rope_layers=[1, 0], pad_token_id=None, bos_token_id=None, eos_token_id=None,
)  # fmt: skip

PLANTS = {
    # the port rotates q and k on every layer: the NoPE layer (layers.1) gets RoPE too
    "rope_on_nope_layer": [("model.py", 'use_rope=bool(args.extra["no_rope_layers"][i]),', "use_rope=True,")],
}


def smollm3_workspace(base: Path, name: str, **config) -> Path:
    """`new-model NAME --hf-config smollm3.json --path port`, then the agent's port."""
    from test_parity_support import port_workspace

    return port_workspace(base, name, "SmolLM3Config", {**CONFIG, **config}, PORT_MODEL, ADAPTER_METHODS)
