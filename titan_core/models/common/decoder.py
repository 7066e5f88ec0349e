"""A pre-norm decoder-only transformer assembled from TransformerArgs.

Module paths are part of the contract (swaps, adapters and parallel plans name them):
tok_embeddings, layers.<i>.{attention_norm, attention.{wq,wk,wv,wo,q_norm,k_norm,core},
ffn_norm, feed_forward.{w1,w2,w3} | moe.{router.gate, experts, shared_expert}}, norm,
output, loss_head. `Transformer` is a `ModelBase` (protocol.py): what the trainer and the
parallel plans read of a model, with the defaults a model that runs wholly on these layers has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.attention import Attention
from titan_core.models.common.layers import CrossEntropyHead, FeedForward, RMSNorm, rope_cos_sin, rope_inv_freq, softcap
from titan_core.models.common.moe import MoE, load_balancing_loss
from titan_core.models.common.protocol import ModelBase


class Block(nn.Module):
    """Pre-norm decoder layer i: x + attention(attention_norm(x)), then x + mlp(ffn_norm(x)).

    The MLP is `moe` (a MoE) on layers args.layer_is_moe(i), else `feed_forward`. There are
    no post-norms (on a sub-layer's output before the residual add): a model that has them
    (OLMo-2, Gemma-2) is a port with its own Block.
    """

    def __init__(self, args: TransformerArgs, i: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(
            args.dim,
            args.n_heads,
            args.n_kv_heads,
            args.head_dim,
            qkv_bias=args.qkv_bias,
            out_bias=args.out_bias,
            qk_norm=args.qk_norm,
            norm_eps=args.norm_eps,
            window=args.layer_window(i),
            use_rope=args.layer_uses_rope(i),
        )
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        if args.layer_is_moe(i):
            self.moe = MoE(
                args.dim,
                args.moe_hidden_dim,
                args.n_experts,
                args.top_k,
                norm_topk_prob=args.norm_topk_prob,
                shared_hidden_dim=args.shared_expert_hidden_dim,
            )
        else:
            self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(self, x, cos, sin, segment_ids=None):
        """Returns (x, this block's routing statistics: moe.routing_stats, a 0 scalar when dense)."""
        x = x + self.attention(self.attention_norm(x), cos, sin, segment_ids)
        h = self.ffn_norm(x)
        if hasattr(self, "moe"):
            out, aux = self.moe(h)
        else:
            out, aux = self.feed_forward(h), x.new_zeros(())
        return x + out, aux


class Transformer(ModelBase):
    def __init__(self, args: TransformerArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args, i) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        self.loss_head = CrossEntropyHead(args.final_softcap)
        self.register_buffer(
            "inv_freq", rope_inv_freq(args.head_dim, args.rope_theta, args.rope_scaling), persistent=False
        )

    # ---- weights -------------------------------------------------------------------
    @property
    def output_weight(self) -> torch.Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Initialise every parameter in place (after `to_empty` on the target device).

        As transformers' `_init_weights` initialises the upstream classes, which parity's init
        check compares with (onboard/upstream/init_check.py): every projection, embedding and
        expert normal(0, init_std = the config's initializer_range), norm weights 1, biases 0.
        No depth scaling of the residual-output projections: upstream has none. Logits start
        near zero, which puts the step-1 loss near ln(vocab).
        """
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.tok_embeddings.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if leaf == "bias":  # before the norm rule: a LayerNorm's bias is 0, not 1
                p.zero_()
            elif owner.rpartition(".")[2].endswith("norm"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, self.args.init_std, generator=gen)
        self.inv_freq.copy_(rope_inv_freq(self.args.head_dim, self.args.rope_theta, self.args.rope_scaling))

    # ---- forward -------------------------------------------------------------------
    def hidden(self, tokens, *, positions=None, segment_ids=None):
        """Final-normed hidden states [batch, seq, dim] and the MoE layers' routing statistics, summed."""
        h = self.tok_embeddings(tokens)
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, h.dtype)
        aux = h.new_zeros((), dtype=torch.float32)
        for block in self.layers.values():
            h, layer_aux = block(h, cos, sin, segment_ids)
            aux = aux + layer_aux
        return self.norm(h), aux

    def forward(self, tokens, *, positions=None, segment_ids=None):
        """Logits [batch, seq, vocab] (soft-capped when the family caps them)."""
        h, _ = self.hidden(tokens, positions=positions, segment_ids=segment_ids)
        return softcap(F.linear(h, self.output_weight), self.args.final_softcap)

    def loss(self, tokens, labels, *, positions=None, segment_ids=None):
        """Training loss: cross-entropy plus the weighted load-balancing loss. Returns (loss, ce)."""
        h, aux = self.hidden(tokens, positions=positions, segment_ids=segment_ids)
        ce = self.loss_head(h, self.output_weight, labels)
        # one loss over all MoE layers' tokens, as transformers computes it (moe.load_balancing_loss)
        n_moe = sum(self.args.layer_is_moe(i) for i in range(self.args.n_layers))
        if self.args.aux_loss_coef and n_moe:
            return ce + self.args.aux_loss_coef * load_balancing_loss(aux, n_moe), ce
        return ce, ce
