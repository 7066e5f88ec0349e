"""One optimizer step through the pipeline schedule (parallelism.pp > 1; titan_core/parallel/pipeline.py).

The step is the eager step's arithmetic, run by the schedule: each micro-batch's loss term is
`micro_batch_term` of the last stage's loss and cross-entropy (titan_core/parallel/token_mean.py), so
the terms sum to the same global token-mean loss as with pp = 1 and the same grad_accum, and
the gradients are those of that loss (the schedule does not rescale them). The gradient norm
is over every stage's parameters (the squared norms all-reduced over the pp group), and each
rank's optimizer steps only the parameters of its own stages.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from titan_core.config.sections import JobConfig
from titan_core.data.base import Batch
from titan_core.models.common.decoder import Transformer
from titan_core.parallel import clip_grad_norm_
from titan_core.parallel.context_parallel import loss_world
from titan_core.parallel.pipeline import Pipeline, build_pipeline
from titan_core.parallel.regather import regathering
from titan_core.parallel.token_mean import micro_batch_term, weighted_head_mean


def stacked(batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(tokens, labels, loss kwargs) of the micro-batches stacked on dim 0: the schedule splits them back
    into these same micro-batches."""
    kwargs = {k: torch.cat([b.loss_kwargs()[k] for b in batches]) for k, v in batches[0].loss_kwargs().items()
              if v is not None}  # fmt: skip
    return torch.cat([b.tokens for b in batches]), torch.cat([b.labels for b in batches]), kwargs


class PipelineStep:
    """This rank's stages of `model` (cut, materialised and sharded here, in place) and its step."""

    def __init__(
        self, model: Transformer, cfg: JobConfig, mesh: DeviceMesh, device: torch.device,
        expert_mesh: DeviceMesh | None = None,
    ):
        self.training = cfg.training
        self.cfg = cfg
        # the token mean's scale: ranks holding distinct tokens (data-parallel peers, and cp's of the same rows)
        self.dp_world = loss_world(mesh)
        self.n_tokens: torch.Tensor | None = None
        """The step's global count of valid labels, set before the schedule runs (its loss_fn reads it)."""
        self.pipe: Pipeline = build_pipeline(model, cfg, mesh, device, self._term, expert_mesh)
        self.sharded_init = self.pipe.sharded_init
        self._held_out = False
        """Whether the schedule is running a validation's forward (its loss_fn then sums, not scales)."""

    def held_out_sums(self, batches: list[Batch]) -> torch.Tensor:
        """The sum over `batches` (training.grad_accum micro-batches, the schedule's count) of each one's
        head mean times its valid labels, through every stage, forward only; the same on every pp rank
        (the last stage computes it, an all-reduce over the pp group hands it to the others). fp32."""
        tokens, labels, kwargs = stacked(batches)
        self._held_out = True
        try:
            sums = self.pipe.evaluate(tokens, labels, **kwargs)
        finally:
            self._held_out = False
        device = batches[0].labels.device
        total = torch.stack(sums).sum() if sums else torch.zeros((), dtype=torch.float32, device=device)
        dist.all_reduce(total, group=self.pipe.group)
        return total

    def _term(self, loss: torch.Tensor, ce: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self._held_out:  # a validation's forward: the head mean weighed by its valid labels
            return weighted_head_mean(ce, labels)
        return micro_batch_term(loss, ce, labels, self.n_tokens, dp_world=self.dp_world,
                                grad_accum=self.training.grad_accum)  # fmt: skip

    def update(self, model: torch.nn.Module, optimizer, batches: list[Batch], n_tokens: torch.Tensor):
        """Forward, backward, clip and optimizer step over the step's micro-batches; returns (this
        rank's share of the global token-mean loss: 0 off the last stage, grad norm), on the device."""
        optimizer.zero_grad(set_to_none=True)
        self.n_tokens = n_tokens
        tokens, labels, kwargs = stacked(batches)
        with regathering(self.cfg):  # the schedule's forwards: gathered weights gathered again in its backwards
            losses = self.pipe.run(tokens, labels, **kwargs)
        total = torch.zeros((), device=n_tokens.device)
        for term in losses:  # in micro-batch order, as the eager step sums them
            total += term.detach().float()
        self.pipe.sum_tied_grads()  # tied embeddings: the first and last stage's copies, one gradient
        params = [p for p in model.parameters() if p.grad is not None]
        grad_norm = clip_grad_norm_(params, self.training.max_norm, foreach=True, group=self.pipe.group,
                                    counted_elsewhere=self.pipe.counted_elsewhere)  # fmt: skip
        optimizer.step()
        self.n_tokens = None
        return total, grad_norm
