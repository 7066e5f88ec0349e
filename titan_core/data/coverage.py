"""How much of its data a run uses: the refusals of data too broken or too small for the plan, and
the epochs a run went through.

Two refusals (ConfigError, exit 2 from the entry points), shared by the text and the dataset sources:

- `check_valid_fraction`: fewer usable rows than `data.min_valid_fraction` of the non-blank rows.
  A corpus that is mostly bad rows is a wrong file or a wrong `data.field`; training on the few
  rows left would run and exit 0 on data nobody meant.
- `check_epochs`: the planned steps need more passes over the data than `data.max_epochs`
  (0: no bound). A tiny corpus repeated hundreds of times is memorised, and is almost always data
  that went missing on the way (a filter, a path), not a plan.

The unit of both is a *row*: seq_len tokens of a packed stream (a fraction of a row counts), or one
padded row of an unpacked document piece.
"""

from __future__ import annotations

from dataclasses import dataclass

from titan_core.config.loader import ConfigError


@dataclass(frozen=True)
class Plan:
    """The rows one data-parallel rank is asked for over the whole run."""

    steps: int
    grad_accum: int
    batch_size: int
    seq_len: int

    @property
    def rows(self) -> int:
        return self.steps * self.grad_accum * self.batch_size

    def text(self, dp_world: int = 1) -> str:
        """The plan in the config's words, e.g. '30 steps x 1 micro-batch x batch_size 8 = 240 rows of 256 tokens'."""
        ranks = f" x {dp_world} data-parallel ranks" if dp_world > 1 else ""
        rows = self.rows * dp_world
        accum = f"{self.grad_accum} micro-batch{'es' if self.grad_accum != 1 else ''}"
        return (f"{self.steps} steps x {accum} x batch_size {self.batch_size}{ranks} = {rows:,} rows of "
                f"seq_len {self.seq_len} ({rows * self.seq_len:,} tokens)")  # fmt: skip


def epochs_text(epochs: float | None) -> str:
    """'0.4 epochs', '1.6 epochs', '171 epochs'; None (one pass not finished, so its length is unknown):
    'part of one epoch'."""
    if epochs is None:
        return "part of one epoch (its end not reached)"
    return f"{epochs:.1f} epochs" if epochs < 10 else f"{epochs:,.0f} epochs"


def check_valid_fraction(valid: int, total: int, fraction: float, *, where: str, bad: str = "") -> None:
    """Refuse `valid` usable rows of `total` non-blank ones when fewer than `fraction` of them.
    `where` names the rows ("data file 'x.jsonl'", "the first 1000 rows of ..."); `bad` says why rows were bad."""
    if total == 0 or valid >= fraction * total:
        return
    because = f" ({bad})" if bad else ""
    raise ConfigError(
        f"{where}: only {valid} of {total} rows are usable documents ({valid / total:.0%}), fewer than "
        f"data.min_valid_fraction = {fraction:g}{because}; fix the data or data.field, or lower "
        f"--data.min_valid_fraction"
    )


def check_epochs(epoch_rows: float, plan: Plan, max_epochs: int, *, where: str, has: str, dp_world: int = 1) -> None:
    """Refuse a plan that needs more than `max_epochs` passes over data of `epoch_rows` rows (of all
    `dp_world` ranks together). `has` says what one pass holds ('3 documents, 171 tokens')."""
    if max_epochs == 0:
        return
    need = plan.rows * dp_world / epoch_rows if epoch_rows > 0 else float("inf")
    if need <= max_epochs:
        return
    raise ConfigError(
        f"{where} holds {has}, {epoch_rows:,.1f} rows of seq_len {plan.seq_len} per epoch, but the run plans "
        f"{plan.text(dp_world)}: {epochs_text(need)}, more than data.max_epochs = {max_epochs}; add data, "
        f"lower training.steps, or raise --data.max_epochs (0: no bound)"
    )
