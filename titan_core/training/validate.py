"""The held-out loss: `[validation]` every `freq` steps and at the last step.

What a validation computes: the cross-entropy over up to `validation.steps` micro-batches of the
held-out data, as one mean over every valid token of them on every data-parallel rank (the
global-token mean the training loss uses, titan_core/parallel/token_mean.py: each micro-batch's
head mean is weighed by its own valid-token count, and the sums are reduced over the
data-parallel group; tensor-parallel peers hold the same rows and are not counted again). An
MoE's load-balancing term is left out: it is a training regulariser, not a loss of the data.
The perplexity is exp of that loss.

How it runs:

- Same parallelism as training. Every rank validates, at the same steps and over the same number
  of micro-batches, because the forward's collectives (SimpleFSDP / FSDP2 gathering the sharded
  parameters, tensor-parallel reductions) need every rank.
- No gradients: `torch.no_grad()`, the model in eval mode for the forward (then back in the mode
  it was in), the optimizer never touched.
- The recipe's execution mode where the mode allows it. Per-block compile: the compiled blocks run
  the forward (they recompile once for eval / no_grad). The Graph Trainer: its captured program is
  the whole step, backward and optimizer included, so validation runs the model's plain (eager)
  forward over the weights the captured step wrote back. Pipeline stages (pp > 1): the schedule's
  forward-only pass over `training.grad_accum` micro-batches at a time (a last short group is filled
  with micro-batches without a valid label, which add nothing), the sum read on the last stage and
  summed over the pp group.
- The held-out data is read by the training data's own machinery (`build_data_loader` with
  data.path replaced by validation.path, `data.repeat_batch` off, the run's data-parallel
  sharding), and each validation rewinds it to its start: the same batches every time. A
  synthetic source (and a model's own samples, `args.own_samples`) draws its held-out rows from a seed of
  their own, so they are not the training rows.
- A held-out set shorter than `steps` micro-batches gives what it has: whole global batches of a
  source that knows its length (text: `num_rows`), or batches until one rank's stream ends (a
  streamed source, data.source = dataset, is read once to its end, not started over: its
  `endless` is off), and then every rank stops there. One with no batch at all is a ConfigError naming validation.path,
  raised when the trainer is built, before step 1.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.data import build_data_loader
from titan_core.data.base import IGNORE_INDEX, Batch, mix_seed
from titan_core.parallel.token_mean import valid_tokens, weighted_head_mean

_SEED_SALT = 0x7A11D
"""Mixed into training.seed for synthetic held-out rows: the training rows' seed would repeat them."""


def perplexity(loss: float) -> float:
    """exp(loss); inf where that overflows a float, nan for a nan loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def _as_validation_error(e: ConfigError) -> ConfigError:
    """The loader names the field it was handed (data.path); the user wrote validation.path."""
    return ConfigError(str(e).replace("data.path", "validation.path"))


def validation_config(cfg: JobConfig) -> JobConfig:
    """The config whose data section reads the held-out set: data.path -> validation.path, no
    repeated batch, and (synthetic sources) a seed of its own. ConfigError when the two sections disagree."""
    v = cfg.validation
    synthetic = cfg.data.source == "synthetic"
    if synthetic and v.path:
        raise ConfigError(
            f"validation.path '{v.path}' is set, but data.source = 'synthetic' reads no files: its held-out rows "
            "are synthetic too (drop validation.path, or read real data with data.source)"
        )
    if not synthetic and not v.path:
        raise ConfigError(
            f"validation.enable needs validation.path: the held-out data, read as data.source = '{cfg.data.source}' "
            "reads data.path"
        )
    out = copy.deepcopy(cfg)
    out.data.path = v.path
    out.data.repeat_batch = False
    if synthetic:
        out.training.seed = mix_seed(cfg.training.seed, _SEED_SALT)
    return out


class Validator:
    """Computes and holds the validation columns of the steps it ran at.

    `maybe_run(model, step)` after step `step`'s update; `columns(step)` gives that step's
    `val_loss`, `val_ppl` and `val_tokens` once (an empty dict for a step without validation, and
    always when validation is off), for the step's metrics row.
    """

    def __init__(
        self,
        cfg: JobConfig,
        *,
        vocab_size: int,
        dp_rank: int = 0,
        dp_world: int = 1,
        dp_group=None,
        device: torch.device | str = "cpu",
        own_samples=None,
        split=None,
        held_out_sums: Callable[[list[Batch]], torch.Tensor] | None = None,
        micro_batches: int = 1,
    ):
        self.enabled = cfg.validation.enable
        self.freq = cfg.validation.freq
        self.steps = cfg.validation.steps
        self.last_step = cfg.training.steps
        self.path = cfg.validation.path
        self.dp_group = dp_group
        self.split = split
        """cp > 1: this rank's share of each row (parallel/context_parallel.SequenceSplit); None otherwise."""
        self.held_out_sums = held_out_sums
        """pp > 1: the pipeline's forward of `micro_batches` micro-batches at once, returning the sum of each
        one's head mean times its valid labels over every stage (training/pipeline_step.py); None: model.loss."""
        self.micro_batches = micro_batches
        self.device = torch.device(device)
        self._results: dict[int, dict[str, Any]] = {}
        self.loader = None
        self.num_batches: int | None = None
        """Micro-batches per validation when the held-out source knows its length (None: until it ends)."""
        if not self.enabled:
            return
        held_out = validation_config(cfg)
        try:
            self.loader = build_data_loader(held_out, vocab_size=vocab_size, dp_rank=dp_rank, dp_world=dp_world,
                                            own_samples=own_samples)  # fmt: skip
        except ConfigError as e:
            raise _as_validation_error(e) from None
        if hasattr(self.loader, "endless"):
            self.loader.endless = False  # a streamed source: end at its last row instead of starting over
        self._start = copy.deepcopy(self.loader.state_dict())
        rows = getattr(self.loader, "num_rows", None)
        why = ""
        if isinstance(rows, int):
            # whole global batches only: past them a row loader wraps to its first rows again
            self.num_batches = min(self.steps, rows // (self.loader.batch_size * dp_world))
            empty = self.num_batches == 0
        else:
            try:
                have = self._draw() is not None
            except ConfigError as e:  # e.g. a shard without a usable document: every rank must hear of it
                have, why = False, str(_as_validation_error(e))
            empty = not self._agree(have)
        if empty:
            raise ConfigError(
                why
                or f"validation.path '{self.path}' holds no whole batch of held-out data (batch_size "
                f"{cfg.training.batch_size} x {dp_world} data-parallel ranks of seq_len {cfg.training.seq_len}) "
                "on every data-parallel rank: add held-out data or lower training.batch_size / training.seq_len"
            )

    def due(self, step: int) -> bool:
        """Whether a validation follows `step`: every `freq` steps and the last step; the same on every rank."""
        return self.enabled and (step % self.freq == 0 or step == self.last_step)

    def maybe_run(self, model: torch.nn.Module, step: int) -> None:
        """Validate after `step` if it is due (a collective: every rank calls it at every step)."""
        if self.due(step):
            self._results[step] = self.run(model)

    def columns(self, step: int) -> dict[str, Any]:
        """The validation columns of `step`'s metrics row (each handed out once; {} when none)."""
        return self._results.pop(step, {})

    def run(self, model: torch.nn.Module) -> dict[str, Any]:
        """One validation over the held-out batches, from their start: {val_loss, val_ppl, val_tokens}."""
        self.loader.load_state_dict(copy.deepcopy(self._start))
        was_training = model.training
        model.eval()
        # the sum over micro-batches of (head mean x its valid tokens), fp32 as the training loss, and
        # the valid tokens, int64 (fp32 counts stop being exact past 2^24 tokens)
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        tokens = torch.zeros((), dtype=torch.int64, device=self.device)
        try:
            with torch.no_grad():
                pending: list[Batch] = []
                for batch in self._batches():
                    batch = batch.to(self.device)
                    if self.split is not None:
                        batch = self.split(batch)
                    tokens += valid_tokens(batch.labels)
                    if self.held_out_sums is not None:  # the pipeline takes its micro-batches together
                        pending.append(batch)
                        if len(pending) == self.micro_batches:
                            total += self.held_out_sums(pending)
                            pending = []
                        continue
                    _, ce = model.loss(batch.tokens, batch.labels, **batch.loss_kwargs())
                    total += weighted_head_mean(ce, batch.labels)
                if pending:  # the last, short group: filled with micro-batches without a valid label (add 0)
                    blank = replace(pending[-1], labels=torch.full_like(pending[-1].labels, IGNORE_INDEX))
                    total += self.held_out_sums(pending + [blank] * (self.micro_batches - len(pending)))
        finally:
            model.train(was_training)
        if self.dp_group is not None:
            dist.all_reduce(total, group=self.dp_group)
            dist.all_reduce(tokens, group=self.dp_group)
        total, tokens = total.item(), tokens.item()
        loss = total / tokens if tokens > 0 else math.nan
        return {"val_loss": loss, "val_ppl": perplexity(loss), "val_tokens": tokens}

    def _batches(self):
        """This validation's micro-batches of this rank (the loader rewound to its start)."""
        if self.num_batches is not None:
            for _ in range(self.num_batches):
                yield next(self.loader)
            return
        for _ in range(self.steps):
            batch = self._draw()
            if not self._agree(batch is not None):
                return
            yield batch

    def _draw(self):
        """The next held-out micro-batch of this rank, or None when its iterator has ended."""
        try:
            return next(self.loader)
        except StopIteration:
            return None

    def _agree(self, have: bool) -> bool:
        """Whether every rank has a batch (one all-reduce over the world: each forward needs every rank)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return have
        flag = torch.tensor([1 if have else 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())
