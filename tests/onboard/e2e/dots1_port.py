"""A dots.llm1 (dots1) port written the way an agent writes one, for the planted-bug parity tests
(no test here; imported by test_parity_plants.py).

dots1 is a DeepSeek-V3-style MoE on a Qwen3 attention (QK-norm per head): the first
`first_k_dense_replace` layers are dense, the rest route each token with a sigmoid router to
`num_experts_per_tok` of `n_routed_experts` experts and add a shared expert. The router picks
experts by `sigmoid(logits) + e_score_correction_bias` (a persistent buffer, trained outside the
gradient to balance the load), limited to the `topk_group` best of `n_group` groups (a group scored
by its two best experts), and weighs them by the plain sigmoid scores, renormalised when
`norm_topk_prob`, times `routed_scaling_factor`. Chosen among transformers' two such models
(glm4_moe is the other) as the smaller upstream: one QK-norm, no partial rotary.

`new-model --path port` on a dots1 config starts from qwen3 (its adapter reads the most keys); the
agent replaces model.py with PORT_MODEL and adds ADAPTER_METHODS to adapter.py. The experts keep
transformers' layout (gate_up_proj [E, 2I, D], gate rows first; down_proj [E, D, I]), so the adapter
only renames; they compute through titan_core's SwiGLU experts kernel, handed transposed views.

The tiny config: 2 layers (layer 0 dense, layer 1 MoE), 8 experts in 4 groups of 2 (the group score
needs two per group), top-2 of the best 2 groups, one shared expert, norm_topk_prob and a routed
scaling factor of 2.5, so that every branch of the router computes something.
"""

from __future__ import annotations

from pathlib import Path

PORT_MODEL = '''"""dots.llm1 on titan_core's shared layers: Qwen3 attention, dense then MoE layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.attention import Attention
from titan_core.models.common.layers import CrossEntropyHead, FeedForward, RMSNorm, rope_cos_sin, rope_inv_freq
from titan_core.models.common.moe import Experts as SwiGLUExperts
from titan_core.models.common.protocol import ModelBase


class Router(nn.Module):
    """Sigmoid router, group-limited, with a score-correction bias that chooses experts but never weighs them.

    forward(x [tokens, dim]) -> (logits [tokens, E] fp32, weights [tokens, k] in x's dtype, experts [tokens, k]).
    """

    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.top_k, self.n_group, self.topk_group = args.top_k, args.extra["n_group"], args.extra["topk_group"]
        self.norm_topk_prob, self.scale = args.norm_topk_prob, args.extra["routed_scaling_factor"]
        self.weight = nn.Parameter(torch.empty(args.n_experts, args.dim))
        # persistent: checkpoints carry it (balancing keeps changing it), so it loads and exports with the weights
        self.register_buffer("e_score_correction_bias", torch.zeros(args.n_experts))

    def forward(self, x):
        logits = F.linear(x.float(), self.weight.float())  # routing in fp32, as upstream keeps it
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias
        # a group is scored by its two best experts; only the topk_group best groups may be chosen
        grouped = choice.view(x.shape[0], self.n_group, -1)
        groups = grouped.topk(2, dim=-1).values.sum(-1).topk(self.topk_group, dim=-1, sorted=False).indices
        allowed = torch.zeros_like(grouped[..., 0]).scatter_(1, groups, 1.0).bool()
        choice = choice.masked_fill(~allowed.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
        experts = choice.topk(self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, experts)  # the plain scores: the correction bias only chose
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return logits, (weights * self.scale).to(x.dtype), experts


class Experts(nn.Module):
    """The routed experts in transformers' layout, computed by titan_core's SwiGLU experts kernel."""

    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(args.n_experts, 2 * args.moe_hidden_dim, args.dim))
        self.down_proj = nn.Parameter(torch.empty(args.n_experts, args.dim, args.moe_hidden_dim))
        self.kernel = SwiGLUExperts.without_weights()

    def forward(self, x, weights, experts):
        gate, up = self.gate_up_proj.chunk(2, dim=1)  # [E, I, D] each: F.linear's layout, the kernel's transposed
        as_kernel = (gate.transpose(1, 2), up.transpose(1, 2), self.down_proj.transpose(1, 2))
        return self.kernel(x, weights, experts, expert_weights=as_kernel)


class MoE(nn.Module):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.router = Router(args)
        self.experts = Experts(args)
        self.shared_expert = FeedForward(args.dim, args.shared_expert_hidden_dim)

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        _, weights, experts = self.router(flat)
        out = self.experts(flat, weights, experts) + self.shared_expert(flat)
        return out.reshape(x.shape)


class Block(nn.Module):
    """Pre-norm block; dense for the first `first_k_dense_replace` layers (args.dense_layers), MoE after."""

    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(
            args.dim, args.n_heads, args.n_kv_heads, args.head_dim, qkv_bias=args.qkv_bias, out_bias=args.out_bias,
            qk_norm=True, norm_eps=args.norm_eps,
        )  # fmt: skip
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        moe = args.layer_is_moe(i)
        self.moe = MoE(args) if moe else None
        self.feed_forward = None if moe else FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + (self.moe(h) if self.moe is not None else self.feed_forward(h))


class Model(ModelBase):
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
        """Upstream's init: norm weights 1, every other weight normal(0, initializer_range), the
        correction bias 0 (a buffer: after to_empty it holds garbage until set here)."""
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.rpartition(".")[0].endswith("norm"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, self.args.init_std, generator=gen)
        pad = self.tok_embeddings.padding_idx
        if pad is not None:
            self.tok_embeddings.weight[pad].zero_()  # nn.Embedding's own init zeroes the pad row; upstream keeps that
        for name, b in self.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()
        self.inv_freq.copy_(rope_inv_freq(self.args.head_dim, self.args.rope_theta, self.args.rope_scaling))

    def hidden(self, tokens):
        h = self.tok_embeddings(tokens)
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)
        for block in self.layers.values():
            h = block(h, cos, sin)
        return self.norm(h)

    def forward(self, tokens):
        return F.linear(self.hidden(tokens), self.output_weight)

    def loss(self, tokens, labels):
        """dots1 has no load-balancing loss (the correction bias balances): the loss is the cross-entropy."""
        ce = self.loss_head(self.hidden(tokens), self.output_weight, labels)
        return ce, ce


def build_model(args: TransformerArgs) -> Model:
    return Model(args)
'''

ADAPTER_METHODS = '''
def layer_keys(self):
    """The MoE layers' tensors keep transformers' names and layouts: renames only."""
    shared = (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))
    return {
        **super().layer_keys(),  # the dense layers' feed_forward is qwen3's (llama's) MLP
        "moe.router.weight": "mlp.gate.weight",
        "moe.router.e_score_correction_bias": "mlp.gate.e_score_correction_bias",
        "moe.experts.gate_up_proj": "mlp.experts.gate_up_proj",
        "moe.experts.down_proj": "mlp.experts.down_proj",
        **{f"moe.shared_expert.{w}.weight": f"mlp.shared_experts.{hf}.weight" for w, hf in shared},
    }

def extra_args_from_hf(self, cfg, take):
    """Experts, shared expert, dense prefix; the router's group limit and scale in args.extra."""
    from titan_core.models.common.hf_adapter import AdapterError

    kw = super().extra_args_from_hf(cfg, take)  # QK-norm, attention_bias, windows (qwen3's reading)
    if "sliding_attention" in (cfg.get("layer_types") or []):
        raise AdapterError("dots1 with sliding_attention layers is not ported (this port attends globally)")
    experts, groups = take("n_routed_experts"), take("n_group", 1)
    if experts % groups or experts // groups < 2:
        raise AdapterError(f"{experts} experts in {groups} groups: each group needs 2 or more (its top-2 scores it)")
    return {**kw, "n_experts": experts, "top_k": take("num_experts_per_tok"),
            "moe_hidden_dim": take("moe_intermediate_size"), "norm_topk_prob": take("norm_topk_prob", False),
            "shared_expert_hidden_dim": cfg["moe_intermediate_size"] * take("n_shared_experts"),
            "dense_layers": list(range(take("first_k_dense_replace", 0))),
            "extra": {"n_group": groups, "topk_group": take("topk_group", 1),
                      "routed_scaling_factor": take("routed_scaling_factor", 1.0),
                      "pad_token_id": take("pad_token_id")}}
'''

CONFIG = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=128, moe_intermediate_size=32, vocab_size=256, n_routed_experts=8, num_experts_per_tok=2,
    n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
    routed_scaling_factor=2.5,
)  # fmt: skip

PLANTS = {
    # experts chosen from the sigmoid scores alone: the correction bias is loaded (round trip exact) but unused
    "correction_bias_dropped": [("model.py", "choice = scores + self.e_score_correction_bias\n", "choice = scores\n")],
}


def dots1_workspace(base: Path, name: str, **config) -> Path:
    """`new-model NAME --hf-config dots1.json --path port`, then the agent's port."""
    from test_parity_support import port_workspace

    return port_workspace(base, name, "Dots1Config", {**CONFIG, **config}, PORT_MODEL, ADAPTER_METHODS)
