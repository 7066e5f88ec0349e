"""Batches and the resumable loader contract every data source implements.

Every loader addresses data by *global row index*: micro-batch `k` on dp rank `r` holds
rows `(k * dp_world + r) * batch_size + i`, `i < batch_size`. So ranks never share a row
within a global batch, and a run on one rank with `batch_size * dp_world` rows per batch
sees exactly the union of what the ranks of a sharded run see (a data-parallel run can
be compared with a single-rank one batch for batch). A batch is a pure function of its
index, which makes the loader's state a single counter and a resume exact.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from titan_core.config.loader import ConfigError

IGNORE_INDEX = -100  # the label of a position with no next-token target (CrossEntropyHead's default)


@dataclass
class Batch:
    """One micro-batch; positions and segment_ids are None unless documents are packed."""

    tokens: torch.Tensor
    """[B, S] int64 input ids."""
    labels: torch.Tensor
    """[B, S] int64 next-token targets; -100 where a position has no target."""
    positions: torch.Tensor | None = None
    """[B, S] int64 position within the packed document, 0 at each document start."""
    segment_ids: torch.Tensor | None = None
    """[B, S] int64 index of the document within its row, so attention can stay inside it."""
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    """Named inputs a model takes beside tokens, as keywords of `model.loss` (a flow model's
    noise, timesteps and text conditioning: the model's `args.sample_spec().inputs`). Empty for text."""

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(
            move(self.tokens), move(self.labels), move(self.positions), move(self.segment_ids),
            {k: move(v) for k, v in self.inputs.items()},
        )  # fmt: skip

    def present(self) -> dict[str, torch.Tensor]:
        """Every tensor the batch holds, by name, in a fixed order: tokens, labels, then
        positions and segment_ids when packed, then `inputs` by name."""
        out = {"tokens": self.tokens, "labels": self.labels}
        out |= {k: getattr(self, k) for k in ("positions", "segment_ids") if getattr(self, k) is not None}
        return out | {k: self.inputs[k] for k in sorted(self.inputs)}

    def loss_kwargs(self) -> dict[str, torch.Tensor | None]:
        """The keywords of `model.loss(tokens, labels, **kwargs)` for this batch."""
        return {"positions": self.positions, "segment_ids": self.segment_ids, **self.inputs}


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers; hashing keeps nearby (seed, row) pairs unrelated."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def stack_rows(rows: list[tuple]) -> Batch:
    """One Batch of rows (tokens, labels, positions | None, segment_ids | None[, {named inputs}])."""
    tokens, labels, positions, segments = (list(col) for col in zip(*(r[:4] for r in rows)))

    def stack(ts):
        return None if ts[0] is None else torch.stack(ts)

    inputs = {k: torch.stack([r[4][k] for r in rows]) for k in rows[0][4]} if len(rows[0]) > 4 else {}
    return Batch(torch.stack(tokens), torch.stack(labels), stack(positions), stack(segments), inputs)


class RowLoader:
    """An endless, resumable iterator of Batches built from `row(global_index)`.

    Subclasses provide `row(g) -> (tokens [S, ...], labels [S], positions | None, segment_ids | None)`,
    optionally followed by a dict of named per-row inputs (stacked into `Batch.inputs`), and
    `_identity()`, the settings a saved state must match to be resumable here.
    """

    def __init__(self, *, batch_size: int, seq_len: int, dp_rank: int, dp_world: int, repeat_batch: bool):
        if batch_size < 1 or seq_len < 1:
            raise ConfigError(f"training.batch_size ({batch_size}) and training.seq_len ({seq_len}) must be >= 1")
        if not 0 <= dp_rank < dp_world:
            raise ConfigError(f"dp_rank {dp_rank} is outside [0, dp_world = {dp_world})")
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.dp_rank = dp_rank
        self.dp_world = dp_world
        self.repeat_batch = repeat_batch
        self.step = 0
        """Micro-batches yielded so far (the index of the next one)."""

    # ---- subclass surface ----------------------------------------------------------
    def row(self, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        raise NotImplementedError

    def _identity(self) -> dict[str, Any]:
        raise NotImplementedError

    # ---- iteration -----------------------------------------------------------------
    def batch_at(self, k: int) -> Batch:
        """Micro-batch `k` of this rank, without moving the iterator."""
        first = (k * self.dp_world + self.dp_rank) * self.batch_size
        return stack_rows([self.row(first + i) for i in range(self.batch_size)])

    def __iter__(self) -> RowLoader:
        return self

    def __next__(self) -> Batch:
        batch = self.batch_at(0 if self.repeat_batch else self.step)
        self.step += 1
        return batch

    # ---- resume --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after micro-batch `state["step"]`; refuse a state saved with other data settings."""
        mine = self._identity()
        diffs = [f"{k}: saved {state.get(k)!r}, now {v!r}" for k, v in mine.items() if state.get(k) != v]
        if diffs:
            raise ConfigError("cannot resume the data loader, its settings changed (" + "; ".join(diffs) + ")")
        self.step = int(state["step"])
