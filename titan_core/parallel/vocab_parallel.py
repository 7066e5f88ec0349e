"""The vocabulary split over tensor-parallel ranks: the loss computed on each rank's slice of it.

Under TP (plans.py) the token embedding is split by vocabulary rows (RowwiseParallel: a rank
looks up the tokens of its slice, zeros elsewhere, and the sum over ranks is the embedding)
and the output head by the same rows (ColwiseParallel of the head's [vocab, dim] weight: each
rank computes the logits of its slice). A tied model's one weight is both, split once.

The loss is computed on the vocab-sharded logits, never gathering them (Megatron's
vocab-parallel cross-entropy). Gathering them (the head's output Replicate) would also be exact
and simpler, but every rank would then hold [tokens, vocab] logits and their gradient, the
largest activation of a large-vocabulary model, and the head's whole forward and backward
would cost an all-gather of them; split, a rank holds [tokens, vocab / tp] and the ranks
exchange only per-token scalars: the row max (all-reduce max) and the sum of exponentials with
the target's logit (all-reduce sum, zero from the ranks whose slice does not hold the label).
That makes lse = max + log(sum) and the loss exact on every rank, and the gradient of a rank's
logits is its slice of softmax - one_hot. A soft-cap (glimmer) and z-loss act per logit or on
lse, so they work on slices unchanged. `torch.distributed.tensor.parallel.loss_parallel` does
the same through DTensor but must wrap the backward too (the eager step's and the Graph
Trainer's); this needs no context, and its collectives are functional ones the Graph Trainer
traces.

The fused loss head (kernels.loss = fused_ce) runs on the slice with the same two reductions
per token chunk (titan_core/kernels/fused_ce.py, `tp_group`).

The hidden states come in replicated (the final norm's output; under sequence parallel its
sequence chunks, all-gathered here); each rank's dh is its slice's part of the whole, so their
gradient is declared a partial sum over TP: its backward is an all-reduce (a reduce-scatter
back to the chunks under sequence parallel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from titan_core.config.loader import ConfigError
from titan_core.kernels.fused_ce import FusedCrossEntropyHead, ZLossCrossEntropyHead, fused_linear_cross_entropy
from titan_core.models.common.layers import CrossEntropyHead, softcap
from titan_core.runtime.collectives import all_reduce

HEADS = (CrossEntropyHead, ZLossCrossEntropyHead, FusedCrossEntropyHead)
"""The loss heads that run on a vocabulary slice (kernels.loss plain, plain with z-loss, fused_ce)."""


class _SumOverTP(torch.autograd.Function):
    """All-reduce (sum) whose backward is the identity: every rank computes the same loss from the
    sum, so a rank's part of it gets the gradient of the sum itself, not tp copies of it."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, "sum", group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def vocab_parallel_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_start: int,
    group,
    final_softcap: float | None = None,
    z_loss: float = 0.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """`reference_cross_entropy` (kernels/fused_ce.py) of the whole vocabulary when `weight` holds only
    its rows [vocab_start, vocab_start + rows) and the other TP ranks of `group` hold the rest."""
    logits = softcap(F.linear(hidden, weight), final_softcap).flatten(0, -2).float()
    labels = labels.flatten()
    valid = labels != ignore_index
    local = labels - vocab_start
    hit = valid & (local >= 0) & (local < weight.shape[0])
    # no gradient through the max: lse = max + log(sum exp(logits - max)) does not depend on it
    row_max = all_reduce(logits.detach().amax(dim=-1), "max", group)
    target = torch.where(hit, logits.gather(1, torch.where(hit, local, 0)[:, None])[:, 0], 0.0)
    sums = _SumOverTP.apply(torch.stack([(logits - row_max[:, None]).exp().sum(dim=-1), target]), group)
    lse = row_max + torch.log(sums[0])
    per_token = lse - sums[1]
    if z_loss:
        per_token = per_token + z_loss * lse * lse
    return torch.where(valid, per_token, 0.0).sum() / valid.sum()


def replicated_for_head(hidden: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Every TP rank's whole copy of `hidden` (a DTensor on `mesh`, or a plain replicated tensor),
    whose gradient is summed over the ranks (module docstring)."""
    if isinstance(hidden, DTensor):
        dt = hidden.redistribute(placements=[Replicate()])
    else:
        dt = DTensor.from_local(hidden, mesh, [Replicate()], run_check=False)
    return dt.to_local(grad_placements=[Partial()])


class VocabParallelLoss(nn.Module):
    """The model's loss head on a vocab-sharded output weight: same call (hidden, weight, labels),
    same settings (those of `head`, kept as the child `head`), the loss of the whole vocabulary."""

    def __init__(self, head: nn.Module):
        super().__init__()
        if type(head) not in HEADS:
            raise ConfigError(
                f"tensor parallel splits the output head by vocabulary: the loss head {type(head).__name__} has no "
                f"vocab-parallel form (kernels.loss plain or fused_ce have one); set parallelism.tp = 1"
            )
        self.head = head

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if not isinstance(weight, DTensor) or tuple(weight.placements) != (Shard(0),):
            raise RuntimeError("VocabParallelLoss needs the output weight split by vocabulary rows over TP (Shard(0))")
        mesh = weight.device_mesh
        h, w = replicated_for_head(hidden, mesh), weight.to_local()
        start, group = mesh.get_local_rank() * w.shape[0], mesh.get_group()
        head = self.head
        if isinstance(head, FusedCrossEntropyHead):
            return fused_linear_cross_entropy(
                h, w, labels, chunk=head.chunk, final_softcap=head.final_softcap, z_loss=head.z_loss,
                ignore_index=head.ignore_index, tp_group=group, vocab_start=start,
            )  # fmt: skip
        z = head.z_loss if isinstance(head, ZLossCrossEntropyHead) else 0.0
        return vocab_parallel_cross_entropy(
            h, w, labels, vocab_start=start, group=group, final_softcap=head.final_softcap, z_loss=z,
            ignore_index=head.ignore_index,
        )  # fmt: skip
