"""Bytes a training step keeps from its forward for its backward, derived from the model's widths.

    saved, on_host, transient = activation_bytes(shape, setup)   # one micro-batch

Tensor by tensor, as models/common/{decoder,attention,layers,moe}.py compute them: under
policy `none` what autograd saves in the eager step; under the Graph Trainer's policies what
compile/graph_trainer/memory_policy.py keeps (`default`: matmul and attention outputs and
block boundaries; `full`: block boundaries only; `offload`: `default`'s set, parked on the
host). `transient` is the most that exists on top of the saved tensors at the backward's
start: the loss head's [tokens, vocab] buffers, or one layer's gradients in flight plus the
values its backward recomputes.

Shapes and setups are read by attribute (memory_estimate.ModelShape and TrainSetup): this
module is the activation half of that file's arithmetic and imports nothing from it.
"""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
POLICIES = ("none", "default", "full", "offload")
"""none: the eager step (autograd saves what it saves); the rest are graph_trainer.memory_policy."""
ROUTED_EXPERTS = ("loop", "grouped_mm", "tokamax")
"""MoE kernels that compute each token on its top_k experts only; `dense` runs every expert on every token."""


def scores_materialised(s, m=None) -> bool:
    """Whether attention builds [heads, seq, seq] scores: the naive reference always, and a model whose
    layers keep the naive core whatever the kernel (`m.scores_pinned`: soft-capped scores)."""
    pinned = bool(getattr(m, "scores_pinned", False))
    return pinned or s.attention == "naive"


def sdpa_upcast(s, m=None) -> bool:
    """Whether SDPA runs on fp32 copies of bf16 q, k, v (a CPU: models/common/attention.py `sdpa`), which
    its backward keeps with its fp32 output."""
    return s.device_type == "cpu" and s.compute_dtype == "bfloat16" and s.attention == "sdpa" and not scores_materialised(s, m)


def keys_per_query(s) -> int:
    """Keys each query attends to: the sequence. A context-parallel rank's view (rank_activations in
    estimate.py) counts seq / cp tokens, whose queries still attend to K and V gathered from every cp rank."""
    return s.seq_len * max(1, getattr(s, "cp", 1))


def _norm(width: int, c: int) -> int:
    """RMSNorm's saved bytes per token beyond its input: the normed output, and the fp32 upcast
    of its input when the model does not compute in fp32 (layers.RMSNorm computes in fp32)."""
    return width * c + (width * 4 if c != 4 else 0)


def layer_bytes_per_token(m, s, *, moe: bool, rope: bool, policy: str) -> int:
    """Bytes one decoder layer keeps for its backward, per token.

    q, k, v are the projections; RoPE saves the rotated halves and the result; SDPA keeps
    its output and fp32 logsumexp; the attention output's reshape to [tokens, heads*head_dim]
    is a copy; the SwiGLU keeps w1's and w3's outputs, the silu and their product.
    """
    c = DTYPE_BYTES[s.compute_dtype]
    d, qd, kd, f = m.dim, m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim, m.ffn_hidden_dim
    routed = m.top_k if s.moe in ROUTED_EXPERTS else m.n_experts  # expert rows per token
    scores = m.n_heads * keys_per_query(s) if scores_materialised(s, m) else 0  # score elements per token
    x_in = d * c  # the block input, read by the first norm's backward (a block boundary)
    if policy == "full":
        return x_in  # only block boundaries survive the forward; the backward recomputes the rest
    lse = m.n_heads * 4
    if policy in ("default", "offload"):  # norms, RoPE, activations and adds are recomputed
        out = x_in + (qd + 2 * kd) * c + qd * c + lse + d * c  # q, k, v, attention out, wo out (for x + attn)
        out += scores * c  # the q @ k^T matmul's output, when scores exist
        if moe:
            out += m.n_experts * c + routed * (2 * m.moe_hidden_dim + d) * c  # router logits, w1/w3 outs, expert out
            out += 2 * m.shared_expert_hidden_dim * c
        else:
            out += 2 * f * c
        return out
    out = x_in + _norm(d, c) + (qd + 2 * kd) * c
    if m.qk_norm:
        out += _norm(qd, c) + _norm(kd, c)
    if rope:
        out += 2 * (qd + kd) * c
    out += qd * c + lse + qd * c  # attention output, logsumexp, the contiguous copy wo reads
    if sdpa_upcast(s, m):  # the flash backward reads fp32 q, k, v and its fp32 output instead of the bf16 one
        out += (2 * qd + 2 * kd) * 4 - qd * c
    if scores:  # k/v repeated to every query head, the fp32 softmax, its cast back (naive)
        out += 2 * qd * c + scores * (4 + (c if c != 4 and (s.attention == "naive" or getattr(m, "scores_pinned", False)) else 0))
    out += d * c + _norm(d, c)  # x + attn (the second norm's input), the second norm
    if moe:
        out += m.n_experts * 4  # router softmax probabilities (fp32)
        gathered = d * c if s.moe in ROUTED_EXPERTS else 0  # x[token] per routed row
        out += routed * (gathered + 4 * m.moe_hidden_dim * c + d * c)  # w1, silu, w3, product; expert out
        out += 4 * m.shared_expert_hidden_dim * c
    else:
        out += 4 * f * c
    return out


def loss_bytes(m, s, tokens: int) -> tuple[int, int]:
    """(saved, transient) bytes of the final norm and the loss head for `tokens` tokens."""
    c, v, d = DTYPE_BYTES[s.compute_dtype], m.vocab_size, m.dim
    policy = s.memory_policy
    final = d * c + (_norm(d, c) if policy == "none" else 0)  # the last block's output (and the eager norm)
    upcast = v * 4 if c != 4 else 0  # logits.float() in the loss head
    if s.loss == "fused_ce":
        # the kernel computes dh [tokens, dim] and dW [vocab, dim] (fp32) in the forward and keeps them
        saved = tokens * (final + d * c) + v * d * 4
        chunk = min(s.ce_chunk, tokens) * v * 4 * (2 if m.final_softcap else 1)
        return saved, chunk + tokens * d * c  # one chunk's buffers, then the cat of dh's parts
    cap = v * c if m.final_softcap else 0
    grads = 2 * v * 4  # gradients of the log-softmax output and of the logits
    if policy == "none":
        saved, transient = final + v * 4 + cap, grads + upcast  # the log-softmax output (fp32), the tanh output
    elif policy == "full":
        saved, transient = final, v * c + upcast + v * 4 + grads + cap  # logits recomputed in the backward
    else:
        saved, transient = final + v * c, upcast + v * 4 + grads + cap  # logits kept, log-softmax recomputed
    return tokens * saved, tokens * transient


def activation_bytes(m, s) -> tuple[int, int, int]:
    """(saved in device memory, saved in host memory, transient at the backward's start) for one micro-batch."""
    if s.memory_policy not in POLICIES:
        raise ValueError(f"unknown memory policy '{s.memory_policy}' ({' | '.join(POLICIES)})")
    tokens, c = s.batch_size * s.seq_len, DTYPE_BYTES[s.compute_dtype]

    def per_layer(policy: str, moe: bool, rope: bool) -> int:
        return layer_bytes_per_token(m, s, moe=moe, rope=rope, policy=policy)

    layers = tokens * sum(n * per_layer(s.memory_policy, moe, rope) for moe, rope, n in m.layer_mix)
    layers += tokens * 2 * m.head_dim * c  # RoPE's cos and sin, shared by every layer
    loss_saved, loss_transient = loss_bytes(m, s, tokens)
    # one layer's backward: what it recomputes (eager's saved tensors the policy did not keep),
    # what an offloaded layer brings back, and the gradients in flight
    back = max(
        per_layer("none", moe, rope)
        - per_layer(s.memory_policy, moe, rope)
        + (per_layer("default", moe, rope) if s.memory_policy == "offload" else 0)
        for moe, rope, _ in m.layer_mix
    )
    expert_width = (m.top_k if s.moe in ROUTED_EXPERTS else m.n_experts) * m.moe_hidden_dim
    in_flight = (2 * m.dim + 3 * max(m.ffn_hidden_dim, expert_width)) * c
    if scores_materialised(s, m):
        in_flight += 2 * m.n_heads * keys_per_query(s) * 4  # the softmax's gradient and the scores'
    elif sdpa_upcast(s, m):
        in_flight += (m.n_heads + 2 * m.n_kv_heads) * m.head_dim * 4  # fp32 gradients of q, k, v
    transient = max(loss_transient, tokens * (back + in_flight))
    if s.memory_policy == "offload" and s.device_type != "cpu":  # on a CPU the host is the device
        return loss_saved, layers, transient
    return layers + loss_saved, 0, transient
