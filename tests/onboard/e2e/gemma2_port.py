"""A Gemma-2 port written the way an agent writes one, for the parity tests of soft-caps,
windows, padding and embedding scale (no test here; imported by test_parity_features.py).

`new-model --path port` on a Gemma2 config starts from glimmer (it reads the window
pattern and the final soft-cap); the agent then replaces model.py with PORT_MODEL and adds
ADAPTER_METHODS to adapter.py: the sandwich norms' keys, and the config values no
TransformerArgs field holds (attention soft-cap, query_pre_attn_scalar, pad id) in
`args.extra`. Each test then breaks one line of the port with `edit_file`.
"""

from __future__ import annotations

from pathlib import Path

PORT_MODEL = '''"""Gemma-2 on titan_core's shared layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.attention import attention_mask
from titan_core.models.common.layers import CrossEntropyHead, apply_rope, rope_cos_sin, rope_inv_freq, softcap
from titan_core.models.common.protocol import ModelBase


class GemmaNorm(nn.Module):
    """RMSNorm with the (1 + weight) convention, in fp32."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class ScaledEmbedding(nn.Embedding):
    """Token embedding times sqrt(dim), inside the embedding as upstream does it."""

    def forward(self, tokens):
        out = super().forward(tokens)
        return out * torch.tensor(self.embedding_dim**0.5, dtype=out.dtype)


class Attention(nn.Module):
    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=args.qkv_bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=args.out_bias)
        self.window = args.layer_window(i)
        self.scale = args.extra["query_pre_attn_scalar"] ** -0.5
        self.cap = args.extra["attn_softcap"]

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-2, -1)) * self.scale
        scores = softcap(scores, self.cap)
        scores = scores.masked_fill(~attention_mask(s, window=self.window, device=x.device), float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x), approximate="tanh") * self.w3(x))


class Block(nn.Module):
    """Sandwich norms: x + post_norm(attention(norm(x))), the same around the MLP."""

    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.attention_norm = GemmaNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, i)
        self.post_attention_norm = GemmaNorm(args.dim, args.norm_eps)
        self.ffn_norm = GemmaNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        self.post_ffn_norm = GemmaNorm(args.dim, args.norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.post_attention_norm(self.attention(self.attention_norm(x), cos, sin))
        return x + self.post_ffn_norm(self.feed_forward(self.ffn_norm(x)))


class Model(ModelBase):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = ScaledEmbedding(args.vocab_size, args.dim, padding_idx=args.extra["pad_token_id"])
        self.layers = nn.ModuleDict({str(i): Block(args, i) for i in range(args.n_layers)})
        self.norm = GemmaNorm(args.dim, args.norm_eps)
        self.loss_head = CrossEntropyHead(args.final_softcap)
        self.register_buffer("inv_freq", rope_inv_freq(args.head_dim, args.rope_theta), persistent=False)

    @property
    def output_weight(self):
        return self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, seed=None):
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if "norm" in name:
                p.zero_()
            else:
                p.normal_(0.0, self.args.init_std, generator=gen)
        self.inv_freq.copy_(rope_inv_freq(self.args.head_dim, self.args.rope_theta))

    def hidden(self, tokens):
        h = self.tok_embeddings(tokens)
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)
        for block in self.layers.values():
            h = block(h, cos, sin)
        return self.norm(h)

    def forward(self, tokens):
        return softcap(F.linear(self.hidden(tokens), self.output_weight), self.args.final_softcap)

    def loss(self, tokens, labels):
        ce = self.loss_head(self.hidden(tokens), self.output_weight, labels)
        return ce, ce


def build_model(args: TransformerArgs) -> Model:
    return Model(args)
'''

ADAPTER_METHODS = '''
def layer_keys(self):
    """Gemma-2's sandwich norms: post-attention, pre- and post-feed-forward."""
    return {
        **super().layer_keys(),
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "post_ffn_norm.weight": "post_feedforward_layernorm.weight",
    }

def extra_args_from_hf(self, cfg, take):
    kw = super().extra_args_from_hf(cfg, take)
    kw["extra"] = {
        "attn_softcap": take("attn_logit_softcapping"),
        "query_pre_attn_scalar": take("query_pre_attn_scalar"),
        "pad_token_id": take("pad_token_id"),
        "hidden_activation": take("hidden_activation"),
    }
    return kw
'''

CONFIG = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=128, vocab_size=256, sliding_window=128, query_pre_attn_scalar=16, pad_token_id=0,
)  # fmt: skip


def gemma2_workspace(base: Path, name: str, **config) -> Path:
    """`new-model NAME --hf-config gemma2.json --path port`, then the agent's port."""
    from test_parity_support import port_workspace

    return port_workspace(base, name, "Gemma2Config", {**CONFIG, **config}, PORT_MODEL, ADAPTER_METHODS)
