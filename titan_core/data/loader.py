"""Synthetic data and `build_data_loader`, the loader `cfg.data` describes.

The loader contract (global row indexing, resumable state) is in base.py; text.py reads
local text files; dataset.py streams data files through `datasets`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.data.base import RowLoader, mix_seed
from titan_core.data.coverage import Plan
from titan_core.data.dataset import DatasetLoader
from titan_core.data.dataset_files import find_data_files
from titan_core.data.hf_tokenizer import locate
from titan_core.data.text import TextLoader, find_text_files


class SyntheticLoader(RowLoader):
    """Uniform random tokens in [0, vocab_size); row g comes from its own generator seeded by (seed, g)."""

    def __init__(self, *, vocab_size: int, seed: int, **kw):
        super().__init__(**kw)
        if vocab_size < 1:
            raise ConfigError(f"vocab_size must be >= 1 for synthetic data, got {vocab_size}")
        self.vocab_size = vocab_size
        self.seed = seed

    def row(self, g: int):
        gen = torch.Generator().manual_seed(mix_seed(self.seed, g))
        seq = torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=gen, dtype=torch.int64)
        return seq[:-1], seq[1:], None, None

    def _identity(self) -> dict[str, Any]:
        return {
            "source": "synthetic", "seed": self.seed, "vocab_size": self.vocab_size, "batch_size": self.batch_size,
            "seq_len": self.seq_len, "dp_rank": self.dp_rank, "dp_world": self.dp_world,
            "repeat_batch": self.repeat_batch,
        }  # fmt: skip


def build_data_loader(
    cfg: JobConfig, *, vocab_size: int, dp_rank: int = 0, dp_world: int = 1,
    own_samples: Callable[..., RowLoader | None] | None = None,
) -> RowLoader:
    """The loader `cfg.data` describes, yielding this rank's micro-batches of `cfg.training` shape.

    `own_samples`: the model's `args.own_samples` (titan_core/models/common/args.py). A model that
    makes its own samples (flux: synthetic rectified-flow samples) trains on those, called with
    this loader's seed and shape; `data.source` must then be synthetic (text cannot feed it).

    With `data.repeat_batch` it yields micro-batch 0 forever (data the model can memorise,
    so the loss must fall). One `next()` is one micro-batch: with
    `training.grad_accum = n` the trainer draws n per optimizer step.
    """
    kw = dict(
        batch_size=cfg.training.batch_size,
        seq_len=cfg.training.seq_len,
        dp_rank=dp_rank,
        dp_world=dp_world,
        repeat_batch=cfg.data.repeat_batch,
    )
    own = own_samples(seed=cfg.training.seed, **kw) if own_samples is not None else None
    if own is not None:
        if cfg.data.source != "synthetic":
            raise ConfigError(
                f"data.source '{cfg.data.source}': this model trains on samples it makes itself "
                f"({type(own).__name__}), so data.source = synthetic; it has no tokenizer to read text with"
            )
        return own
    if cfg.data.source == "synthetic":
        return SyntheticLoader(vocab_size=vocab_size, seed=cfg.training.seed, **kw)
    if cfg.data.format == "chat" and cfg.data.source != "dataset":
        raise ConfigError(
            f"data.format = 'chat' reads a 'messages' column of data files: it needs data.source = 'dataset', "
            f"not '{cfg.data.source}'"
        )
    if cfg.data.source == "text":
        return TextLoader(cfg.data, vocab_size=vocab_size, plan=training_plan(cfg), **kw)
    if cfg.data.source == "dataset":
        return DatasetLoader(cfg.data, vocab_size=vocab_size, plan=training_plan(cfg), **kw)
    raise ConfigError(f"data.source '{cfg.data.source}' is not one of synthetic, text, dataset")


def training_plan(cfg: JobConfig) -> Plan | None:
    """The rows each data-parallel rank is asked for over the run (data.max_epochs bounds them); None for
    the held-out loader, which training/validate.py builds from a copy of the config whose data.path is
    validation.path: it is read once per validation, not for the training plan. (A run that validates
    on its own training data is left unbounded by this too: the two configs cannot be told apart.)"""
    if cfg.validation.enable and cfg.data.path == cfg.validation.path:
        return None
    t = cfg.training
    return Plan(steps=t.steps, grad_accum=t.grad_accum, batch_size=t.batch_size, seq_len=t.seq_len)


def check_data_paths(cfg: JobConfig) -> None:
    """The files `cfg.data` and `[validation]` read, and the tokenizer's, found (ConfigError, one line, when
    one is missing): what a launcher checks once before it starts any process, without reading the data."""
    source = cfg.data.source
    if source == "synthetic":
        return
    find = find_data_files if source == "dataset" else find_text_files
    find(cfg.data.path)
    if cfg.validation.enable and cfg.validation.path:
        find(cfg.validation.path, what="validation.path")
    if cfg.data.tokenizer == "hf":
        locate(cfg.data.tokenizer_path)
