"""Per-step metrics: a rich (or plain) console row and an exact metrics.jsonl line."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

COLUMNS = [
    ("step", "step", "{:d}"),
    ("loss", "loss", "{:.4f}"),
    ("grad_norm", "grad norm", "{:.4f}"),
    ("lr", "lr", "{:.2e}"),
    ("tokens_per_s", "tok/s", "{:,.0f}"),
    ("mfu", "MFU %", "{:.2f}"),
    ("peak_mem_bytes", "peak MiB", "{:,.0f}"),
    ("step_time_s", "step s", "{:.3f}"),
]


def _fmt(key: str, value, fmt: str) -> str:
    if key == "peak_mem_bytes":
        value = value / 2**20
    if key == "mfu":
        value = value * 100
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return fmt.format(value)


class MetricsLogger:
    """Writes every step to metrics.jsonl and prints every `log_freq`-th step.

    Floats go through json, which writes `repr`, so loss and grad norm read back
    bit-identical; `loss_repr`/`grad_norm_repr` spell that out for readers of the file.
    """

    def __init__(self, output_dir: Path, *, log_freq: int = 1, use_rich: bool = True, enabled: bool = True):
        self.enabled = enabled
        self.log_freq = max(log_freq, 1)
        self.use_rich = use_rich
        self.console = Console(stderr=True, highlight=False)
        self.rows: list[dict] = []
        self.path = output_dir / "metrics.jsonl"
        if enabled:
            output_dir.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")

    def log(self, row: dict) -> None:
        row = {**row, "loss_repr": repr(row["loss"]), "grad_norm_repr": repr(row["grad_norm"])}
        self.rows.append(row)
        if not self.enabled:
            return
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if row["step"] == 1 or row["step"] % self.log_freq == 0:
            cells = [_fmt(k, row[k], f) for k, _, f in COLUMNS]
            if self.use_rich:
                self.console.print("  ".join(f"[bold]{name}[/] {c}" for (_, name, _), c in zip(COLUMNS, cells)))
            else:
                self.console.print("  ".join(f"{name}={c}" for (_, name, _), c in zip(COLUMNS, cells)))

    def summary_table(self) -> Table:
        table = Table(title="training metrics")
        for _, name, _ in COLUMNS:
            table.add_column(name, justify="right")
        for row in self.rows:
            table.add_row(*[_fmt(k, row[k], f) for k, _, f in COLUMNS])
        return table

    def close(self) -> None:
        if self.enabled and not self._file.closed:
            self._file.close()
