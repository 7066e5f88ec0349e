"""Fused linear cross-entropy: the loss from hidden states and the output weight, in token chunks.

The plain head materialises logits [tokens, vocab], then a log-softmax and a gradient of
the same size: at 4k tokens x 128k vocab each copy is 2 GiB in fp32. Here the tokens are
walked in chunks of `chunk` rows; for each chunk the kernel computes the logits over the
whole vocabulary, the exact logsumexp, the loss, and (when a gradient is wanted) the
gradient softmax - one_hot *in place in the same buffer*, then the two gradient matmuls:
dh for the chunk's rows, and dW accumulated in fp32. The backward only scales those by the
incoming gradient. Peak extra memory is about one (two with soft-cap) [chunk, vocab] fp32
buffers instead of three [tokens, vocab] ones.

Why token chunks and gradients in the forward: it does the plain path's three matmuls and
no more. Chunking the vocabulary instead needs the full logsumexp before any dW row can be
written, so logits get computed twice (a fourth matmul, ~1.33x the work), which on a
matmul-bound device misses the "no more than 1.3x the plain path's time" target. The price
is that the backward runs once: it scales the saved gradients in place (a second
backward through the same graph, `retain_graph=True`, raises).

Soft-capping (cap * tanh(logits / cap)), ignore_index and z-loss (z * lse^2 per kept token)
are folded in. bf16 inputs run their matmuls in bf16 (like the plain path); softmax, lse and
the dW accumulation run in fp32 (so with bf16 weights dW is held in fp32 until the backward
casts it: twice the bf16 gradient's size). Pure torch ops with no host sync: works under
torch.compile and make_fx.

Under tensor parallel (`tp_group`) `weight` is this rank's slice of the vocabulary, rows
[vocab_start, vocab_start + rows): each chunk's row max is all-reduced (max) and its sum of
exponentials and target logit (zero on ranks whose slice does not hold the label) together
(sum), two small all-reduces per chunk, so the loss, lse and the local softmax are exact; dW is
then this slice's own, and dh this slice's part of the whole, which the caller sums over the
ranks (titan_core/parallel/vocab_parallel.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from titan_core.models.common.layers import CrossEntropyHead, softcap
from titan_core.runtime.collectives import all_reduce


def _chunk_grads(p, t, lab, total, lse, row_scale, z_loss, hc, w, dh_parts, dw, hit_scale) -> None:
    """Turn one chunk's exp(logits - max) buffer into d loss / d logits, in place, and apply it.

    d loss / d logits = (softmax * (1 + 2 z lse) - one_hot) / n_valid on kept rows (row_scale
    is 1 / n_valid there and 0 on ignored rows); with a soft-cap, times 1 - tanh^2. hit_scale is
    row_scale where the label lies in `w`'s rows (all kept rows without TP), else 0.
    """
    coef = row_scale / total * (1 + 2 * z_loss * lse) if z_loss else row_scale / total
    g = p.mul_(coef[:, None]).scatter_add_(1, lab, -hit_scale[:, None])
    if t is not None:
        g.mul_(t.mul_(t).neg_().add_(1))
    g = g.to(hc.dtype)
    if dh_parts is not None:
        dh_parts.append(g @ w)
    if dw is not None:
        if g.dtype == torch.float32:
            dw.addmm_(g.t(), hc)
        else:
            dw.add_(g.t() @ hc)


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, labels, chunk, cap, z_loss, ignore_index, group, vocab_start):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        valid = labels != ignore_index
        safe = torch.where(valid, labels, torch.zeros_like(labels))
        n_valid = valid.sum()
        row_scale_all = torch.where(valid, 1.0 / n_valid, 0.0)
        hit, hit_scale_all = valid, row_scale_all
        if group is not None:  # w holds vocabulary rows [vocab_start, vocab_start + rows) only
            local = labels - vocab_start
            hit = valid & (local >= 0) & (local < w.shape[0])
            safe = torch.where(hit, local, torch.zeros_like(local))
            hit_scale_all = torch.where(hit, row_scale_all, 0.0)
        losses, dh_parts = [], ([] if need_h else None)
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        for start in range(0, h.shape[0], chunk):
            end = min(start + chunk, h.shape[0])
            hc, lab = h[start:end], safe[start:end, None]
            logits = (hc @ w.t()).float()
            t = None
            if cap:
                t = logits.div_(cap).tanh_()  # kept: the backward needs 1 - tanh^2
                logits = t * cap
            target = logits.gather(1, lab)[:, 0]
            row_max = logits.amax(dim=1)
            if group is not None:
                target = torch.where(hit[start:end], target, 0.0)
                row_max = all_reduce(row_max, "max", group)
            p = logits.sub_(row_max[:, None]).exp_()  # unnormalised softmax, same buffer
            total = p.sum(dim=1)
            if group is not None:  # one all-reduce for both sums
                total, target = all_reduce(torch.stack([total, target]), "sum", group).unbind(0)
            lse = row_max + torch.log(total)
            per_token = lse - target
            if z_loss:
                per_token = per_token + z_loss * lse * lse
            losses.append(torch.where(valid[start:end], per_token, 0.0).sum())
            if need_h or need_w:
                _chunk_grads(p, t, lab, total, lse, row_scale_all[start:end], z_loss, hc, w, dh_parts, dw,
                             hit_scale_all[start:end])  # fmt: skip
            # Drop this chunk's [chunk, vocab] buffers before the next matmul allocates its own.
            del logits, p, t
        loss = torch.stack(losses).sum() / n_valid
        dh = torch.cat(dh_parts) if need_h else None
        ctx.save_for_backward(dh, dw)
        ctx.w_dtype = w.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        dh, dw = ctx.saved_tensors
        if dw is not None:
            # In place: a second [vocab, dim] buffer would cost as much as the whole chunking saves.
            dw = dw.mul_(grad_out).to(ctx.w_dtype)
        if dh is not None:
            dh = dh * grad_out.to(dh.dtype)
        return dh, dw, None, None, None, None, None, None, None


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk: int = 1024,
    final_softcap: float | None = None,
    z_loss: float = 0.0,
    ignore_index: int = -100,
    tp_group=None,
    vocab_start: int = 0,
) -> torch.Tensor:
    """Mean cross-entropy of softcap(hidden @ weight.T) over labels != ignore_index, plus z-loss.

    hidden [..., dim], weight [vocab, dim], labels [...]. Equal (fp32: to rounding) to
    `reference_cross_entropy` without ever holding more than [chunk, vocab] logits.
    `tp_group`: weight is the vocabulary rows from `vocab_start` of the TP rank this is (module
    docstring); the returned loss is the whole vocabulary's, the same on every rank.
    """
    if chunk <= 0:
        raise ValueError(f"kernels.ce_chunk must be positive, got {chunk}")
    h = hidden.reshape(-1, hidden.shape[-1])
    return _FusedLinearCE.apply(h, weight, labels.reshape(-1), int(chunk), final_softcap, float(z_loss), ignore_index,
                                tp_group, int(vocab_start))  # fmt: skip


def reference_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    final_softcap: float | None = None,
    z_loss: float = 0.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """The plain path: full logits, fp32 log-softmax, mean over kept tokens, optional z-loss."""
    logits = softcap(F.linear(hidden, weight), final_softcap).flatten(0, -2).float()
    labels = labels.flatten()
    ce = F.cross_entropy(logits, labels, ignore_index=ignore_index)
    if not z_loss:
        return ce
    valid = labels != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    return ce + z_loss * torch.where(valid, lse * lse, 0.0).sum() / valid.sum()


class FusedCrossEntropyHead(nn.Module):
    """Drop-in for `CrossEntropyHead` (same call, no parameters) using the chunked kernel."""

    def __init__(
        self, final_softcap: float | None = None, ignore_index: int = -100, *, chunk: int = 1024, z_loss: float = 0.0
    ):
        super().__init__()
        self.final_softcap, self.ignore_index = final_softcap, ignore_index
        self.chunk, self.z_loss = chunk, z_loss

    def forward(self, hidden, weight, labels):
        return fused_linear_cross_entropy(
            hidden,
            weight,
            labels,
            chunk=self.chunk,
            final_softcap=self.final_softcap,
            z_loss=self.z_loss,
            ignore_index=self.ignore_index,
        )

    def extra_repr(self) -> str:
        return f"chunk={self.chunk}, final_softcap={self.final_softcap}, z_loss={self.z_loss}"


class ZLossCrossEntropyHead(CrossEntropyHead):
    """The plain head plus z-loss: the reference `kernels.loss=plain` uses when z_loss > 0."""

    def __init__(self, final_softcap: float | None = None, ignore_index: int = -100, *, z_loss: float = 0.0):
        super().__init__(final_softcap, ignore_index)
        self.z_loss = z_loss

    def forward(self, hidden, weight, labels):
        return reference_cross_entropy(
            hidden, weight, labels, final_softcap=self.final_softcap, z_loss=self.z_loss, ignore_index=self.ignore_index
        )
