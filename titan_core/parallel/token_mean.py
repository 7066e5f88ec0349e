"""The training loss of one optimizer step: the mean over every valid token of the global batch.

A step sees `grad_accum` micro-batches on each of `dp_world` data-parallel ranks; a label
equal to IGNORE_INDEX has no target (text data: a document's last token, padding). The
loss heads return the mean cross-entropy over their own valid tokens, so a mean of those
means would weigh a token of a mostly ignored row more than one of a full row, and one
rank's rows more than another's. As in TorchTitan the step instead normalises by the
global count N of valid tokens (summed over the micro-batches and the data-parallel
ranks; tensor-parallel ranks hold the same rows, so they are not counted again):

    micro-batch term = ce_mb * (n_mb * dp_world / N)  +  (loss_mb - ce_mb) / grad_accum

The data-parallel gradient reduce averages over the ranks (SimpleFSDP's `Partial("avg")`,
FSDP2's default), so the `dp_world` factor makes the reduced gradient that of
sum(token losses) / N. `loss - ce` is the MoE load-balancing term, a mean per forward pass:
it stays divided by `grad_accum` (and averaged over ranks by the reduce). A micro-batch
with no valid token contributes exactly 0 to the loss and to every gradient, its
load-balancing term included (it has no token to train on, and its CE, 0/0, is NaN, so
`loss - ce` is too); a step with none at all gives loss 0. All of it without a host sync.

The eager step and the captured Graph Trainer step both call `micro_batch_term`, so they
do the same arithmetic in the same order (the Graph Trainer gets N as a graph input).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from titan_core.data.base import IGNORE_INDEX


def valid_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Number of labels that have a target (int64 scalar on the labels' device)."""
    return (labels != IGNORE_INDEX).sum()


def global_valid_tokens(labels: list[torch.Tensor], group=None) -> torch.Tensor:
    """N: valid labels over the micro-batches of a step, summed over `group` (the data-parallel
    ranks; None: this process only). Stays on the device: no host sync."""
    n = valid_tokens(labels[0])
    for lab in labels[1:]:
        n = n + valid_tokens(lab)
    if group is not None:
        dist.all_reduce(n, group=group)
    return n


def weighted_head_mean(ce: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A micro-batch's head mean times its valid labels, fp32 and detached (a held-out sum's term); 0 for a
    micro-batch without a valid label, whose head mean is 0/0."""
    n = valid_tokens(labels)
    return torch.where(n > 0, ce.detach().float() * n, 0.0)


def micro_batch_term(
    loss: torch.Tensor,
    ce: torch.Tensor,
    labels: torch.Tensor,
    n_global: torch.Tensor,
    *,
    dp_world: int,
    grad_accum: int,
) -> torch.Tensor:
    """This micro-batch's share of the step loss (what is differentiated and summed into the logged loss).

    loss, ce: `model.loss`'s pair (the same tensor when there is no auxiliary term).
    """
    n = valid_tokens(labels)
    # n * dp_world == N (one micro-batch, even ranks) gives exactly 1.0: the unsharded,
    # unaccumulated step is the head's mean itself, bit for bit
    scale = (n * dp_world) / n_global.clamp_min(1)
    term = ce * scale
    if loss is not ce:
        term = term + (loss - ce) / grad_accum
    # no valid label: the head's CE is 0/0 = NaN; `where` passes neither it nor a NaN gradient on
    return torch.where(n > 0, term, 0.0)
