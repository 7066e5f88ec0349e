"""A GPT-OSS port written the way an agent writes one, for the planted-bug parity tests (no test
here; imported by test_parity_plants.py).

GPT-OSS differs from Llama in: attention sinks (a learned logit per head that joins every softmax as
one more key with no value), biases on q, k, v and o, layers alternating sliding_attention and
full_attention (`layer_types`), YaRN RoPE, and MoE layers whose router has a bias and softmaxes only
the top-k logits, and whose experts (gate_up_proj interleaved: gate = even columns, up = odd, with
biases) apply a clamped SwiGLU: gate.clamp(max=limit), up.clamp(-limit, limit),
(up + 1) * gate * sigmoid(alpha * gate).

`new-model --path port` on a GPT-OSS config starts from llama3, whose adapter refuses YaRN; the agent
replaces model.py with PORT_MODEL (attention on titan_core's naive core, which takes `sinks=`; RoPE on
apply_rope / rope_cos_sin, with YaRN's frequencies and cos/sin scale computed here as transformers'
_compute_yarn_parameters does) and adds ADAPTER_METHODS to adapter.py: the sinks', router's and
experts' keys (renames: the experts keep transformers' layout), the window pattern from layer_types,
and the values no TransformerArgs field holds (swiglu_alpha/limit, the YaRN parameters, pad id) in
`args.extra`. The config keeps GPT-OSS's default YaRN (factor 32 over 4096 positions).

The tiny config: 2 layers (one sliding with a 32-token window, one full), 4 experts top-2.
"""

from __future__ import annotations

from pathlib import Path

PORT_MODEL = '''"""GPT-OSS on titan_core's shared layers (attention sinks, sliding windows, clamped-SwiGLU MoE)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.attention import NaiveAttention
from titan_core.models.common.layers import CrossEntropyHead, RMSNorm, apply_rope, rope_cos_sin
from titan_core.models.common.moe import load_balancing_loss, routing_stats
from titan_core.models.common.protocol import ModelBase


def rope_frequencies(head_dim: int, theta: float, rope: dict) -> tuple[torch.Tensor, float]:
    """(inv_freq, cos/sin scale) of the config's RoPE. YaRN blends each frequency between itself
    (extrapolated) and itself / factor (interpolated) along a linear ramp over the channels, and scales
    cos and sin by 0.1 ln(factor) + 1; computed in transformers' order, so the values are its values."""
    pos = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    if rope["rope_type"] == "default":
        return 1.0 / pos, 1.0
    factor, context = rope["factor"], rope["original_max_position_embeddings"]

    def channel(rotations):  # the channel that turns `rotations` times over the original context
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = channel(rope["beta_fast"]), channel(rope["beta_slow"])
    if rope["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    span = high - low if high != low else 0.001  # transformers' guard against a zero-width ramp
    extrapolated = 1 - ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / span).clamp(0, 1)
    inv_freq = 1.0 / (factor * pos) * (1 - extrapolated) + 1.0 / pos * extrapolated
    return inv_freq, (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)


class Attention(nn.Module):
    """GQA with biases, RoPE and a sink logit per head (NaiveAttention's `sinks`: a head may attend to nothing)."""

    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=args.qkv_bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=args.out_bias)
        self.sinks = nn.Parameter(torch.empty(args.n_heads))
        self.scale = args.head_dim**-0.5
        # sliding_attention layers see keys with q - k < window (the query itself counts, as upstream); full: None
        self.window = args.layer_window(i)
        self.core = NaiveAttention()  # the reference core: it takes sinks

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.core(q, k, v, scale=self.scale, window=self.window, segment_ids=None, sinks=self.sinks)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Router(nn.Module):
    """Linear with a bias; the top-k logits are softmaxed among themselves (not over every expert).

    forward(x [tokens, dim]) -> (logits [tokens, E], weights [tokens, k], experts [tokens, k]).
    """

    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.top_k = args.top_k
        self.weight = nn.Parameter(torch.empty(args.n_experts, args.dim))
        self.bias = nn.Parameter(torch.empty(args.n_experts))

    def forward(self, x):
        logits = F.linear(x, self.weight, self.bias)
        top, experts = torch.topk(logits, self.top_k, dim=-1)
        return logits, torch.softmax(top, dim=-1), experts


class Experts(nn.Module):
    """The experts in transformers' layout (x @ w): gate_up_proj [E, dim, 2I] with gate and up
    interleaved column by column, down_proj [E, I, dim], each with a bias; a clamped SwiGLU between."""

    def __init__(self, args: TransformerArgs):
        super().__init__()
        e, d, h = args.n_experts, args.dim, args.moe_hidden_dim
        self.gate_up_proj = nn.Parameter(torch.empty(e, d, 2 * h))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * h))
        self.down_proj = nn.Parameter(torch.empty(e, h, d))
        self.down_proj_bias = nn.Parameter(torch.empty(e, d))
        self.alpha, self.limit = args.extra["swiglu_alpha"], args.extra["swiglu_limit"]

    def swiglu(self, gate_up):
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        # the clamp bounds what a trained model's outliers can do; untrained weights rarely reach it
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return (up + 1) * glu

    def forward(self, x, weights, experts):
        out = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            token, slot = torch.where(experts == e)
            h = self.swiglu(x[token] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e])
            h = h @ self.down_proj[e] + self.down_proj_bias[e]
            out = out.index_add(0, token, h * weights[token, slot, None])
        return out


class MoE(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.n_experts = args.n_experts
        self.router = Router(args)
        self.experts = Experts(args)

    def forward(self, x):
        """(output, routing_stats): the load-balancing loss reads softmax over every expert's logit."""
        flat = x.reshape(-1, x.shape[-1])
        logits, weights, experts = self.router(flat)
        out = self.experts(flat, weights, experts).reshape(x.shape)
        return out, routing_stats(torch.softmax(logits, dim=-1, dtype=torch.float32), experts, self.n_experts)


class Block(nn.Module):
    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, i)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.moe = MoE(args)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        out, stats = self.moe(self.ffn_norm(x))
        return x + out, stats


class Model(ModelBase):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, padding_idx=args.extra["pad_token_id"])
        self.layers = nn.ModuleDict({str(i): Block(args, i) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        self.loss_head = CrossEntropyHead()
        inv_freq, self.rope_scale = rope_frequencies(args.head_dim, args.rope_theta, args.extra["rope"])
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def output_weight(self):
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    @torch.no_grad()
    def init_weights(self, seed=None):
        """Upstream's init: norm weights 1; biases 0 but the router's, which upstream draws like the
        weights (and the sinks); everything else normal(0, initializer_range)."""
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias") and not name.endswith("router.bias"):
                p.zero_()
            else:
                p.normal_(0.0, self.args.init_std, generator=gen)
        if self.tok_embeddings.padding_idx is not None:
            self.tok_embeddings.weight[self.tok_embeddings.padding_idx].zero_()
        self.inv_freq.copy_(rope_frequencies(self.args.head_dim, self.args.rope_theta, self.args.extra["rope"])[0])

    def hidden(self, tokens):
        h = self.tok_embeddings(tokens)
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, torch.float32)
        cos, sin = (cos * self.rope_scale).to(h.dtype), (sin * self.rope_scale).to(h.dtype)
        stats = 0
        for block in self.layers.values():
            h, layer_stats = block(h, cos, sin)
            stats = stats + layer_stats
        return self.norm(h), stats

    def forward(self, tokens):
        return F.linear(self.hidden(tokens)[0], self.output_weight)

    def loss(self, tokens, labels):
        """Cross-entropy, plus router_aux_loss_coef x the load-balancing loss pooled over every layer's
        tokens where output_router_logits turns it on (adapter.py sets aux_loss_coef to 0 otherwise)."""
        h, stats = self.hidden(tokens)
        ce = self.loss_head(h, self.output_weight, labels)
        if not self.args.aux_loss_coef:
            return ce, ce
        return ce + self.args.aux_loss_coef * load_balancing_loss(stats, self.args.n_layers), ce


def build_model(args: TransformerArgs) -> Model:
    return Model(args)
'''

ADAPTER_METHODS = '''
def layer_keys(self):
    """GPT-OSS's own tensors, under transformers' names and layouts (renames only)."""
    experts = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
    return {
        **super().layer_keys(),
        "attention.sinks": "self_attn.sinks",
        "moe.router.weight": "mlp.router.weight",
        "moe.router.bias": "mlp.router.bias",
        **{f"moe.experts.{k}": f"mlp.experts.{k}" for k in experts},
    }

def _rope_from_hf(self, cfg, take):
    """GPT-OSS's RoPE is YaRN, which llama3's reader refuses: theta here, the rest in extra_args_from_hf."""
    take("rope_parameters")
    return {"rope_theta": float(take("rope_parameters.rope_theta", 10000.0)), "rope_scaling": None}

def extra_args_from_hf(self, cfg, take):
    """Biases (attention_bias), the window pattern of layer_types, the experts, and in args.extra the
    clamped SwiGLU's alpha and limit, the YaRN parameters and the pad id."""
    from titan_core.models.common.hf_adapter import AdapterError, window_pattern

    kw = super().extra_args_from_hf(cfg, take)  # q/k/v and o biases from attention_bias
    window = take("sliding_window")
    types = take("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    sliding_window, global_every = window_pattern([window if t == "sliding_attention" else None for t in types])
    rope = {k: take(f"rope_parameters.{k}", default) for k, default in (
        ("rope_type", "default"), ("factor", 1.0), ("beta_fast", 32.0), ("beta_slow", 1.0),
        ("original_max_position_embeddings", None), ("truncate", True))}  # fmt: skip
    if rope["rope_type"] not in ("default", "yarn"):
        raise AdapterError(f"rope_type {rope['rope_type']!r} is not ported (default and yarn are)")
    coef, with_aux = take("router_aux_loss_coef", 0.001), take("output_router_logits", False)
    return {**kw, "sliding_window": sliding_window, "global_every": global_every,
            "n_experts": take("num_local_experts"), "top_k": take("num_experts_per_tok"),
            "moe_hidden_dim": cfg["intermediate_size"], "aux_loss_coef": float(coef) if with_aux else 0.0,
            "extra": {"swiglu_alpha": take("swiglu_alpha"), "swiglu_limit": take("swiglu_limit"), "rope": rope,
                      "pad_token_id": take("pad_token_id")}}
'''

CONFIG = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=32, vocab_size=256, num_local_experts=4, num_experts_per_tok=2, sliding_window=32,
)  # fmt: skip

CLAMP = "        gate = gate.clamp(max=self.limit)\n        up = up.clamp(min=-self.limit, max=self.limit)\n"
PLANTS = {
    # the experts' SwiGLU unclamped: identical until an activation passes swiglu_limit
    "clamp_removed": [("model.py", CLAMP, "")],
    # the core called without the sinks: every query's weights sum to 1 again
    "sinks_dropped": [("model.py", ", sinks=self.sinks)", ")")],
    # the window read as "q - k <= window": each sliding-layer query sees one key too many
    "window_off_by_one": [("model.py", "window=self.window,", "window=self.window + 1 if self.window else None,")],
}


def gpt_oss_workspace(base: Path, name: str, **config) -> Path:
    """`new-model NAME --hf-config gpt_oss.json --path port`, then the agent's port."""
    from test_parity_support import port_workspace

    return port_workspace(base, name, "GptOssConfig", {**CONFIG, **config}, PORT_MODEL, ADAPTER_METHODS)
