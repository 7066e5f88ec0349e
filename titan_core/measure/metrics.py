"""Per-step metrics: a rich (or plain) console row and an exact, strict-JSON metrics.jsonl line.

The file's conventions (`read_metrics` is the one reader that applies them):

- Strict JSON. A float that is not finite (a diverged loss, an overflowing grad norm) is
  written as `null`, and the row then carries `<key>_repr`, the float's `repr` ("nan",
  "inf", "-inf"). `loss_repr` and `grad_norm_repr` are on every row; the others only where
  needed. Finite floats go through json, which writes `repr`, so they read back bit-identical.
- One current row per step. A run that starts after step k (k = 0 for a fresh run, the
  checkpoint's step for a resumed one) first rewrites the file, atomically (temp file and
  rename), to the earlier rows with step <= k, then appends its own. The file therefore
  holds one history, steps 1..N once each. A file written otherwise (appended by hand, or by
  an older version) reads the same way: a row for step s supersedes the earlier rows with
  step >= s.
- Only rank 0 writes (the Trainer enables the logger there alone).
- A step after which the trainer validated also carries `val_loss`, `val_ppl` and `val_tokens`
  (titan_core/training/validate.py); the console line of such a step shows them, whatever
  `log_freq` says.

With `tensorboard` on, every numeric column of every row also goes to TensorBoard event files
under output_dir/tensorboard (`torch.utils.tensorboard.SummaryWriter`, tag = the column's key),
rank 0 only, flushed when the logger closes.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from titan_core.config.loader import ConfigError
from titan_core.runtime.files import atomic_write_text

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
VAL_COLUMNS = [
    ("val_loss", "val loss", "{:.4f}"),
    ("val_ppl", "val ppl", "{:.2f}"),
]
"""Shown after COLUMNS on the rows that have them (the steps a validation followed)."""
TENSORBOARD_DIR = "tensorboard"
"""The event files' folder under output_dir."""


def _fmt(key: str, value, fmt: str) -> str:
    if value is None:  # a summary-table cell of a step without that column
        return ""
    if key == "peak_mem_bytes":
        value = value / 2**20
    if key == "mfu":
        value = value * 100
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return fmt.format(value)


def encode_row(row: dict) -> str:
    """One metrics.jsonl line (no newline): strict JSON, non-finite floats as null + `<key>_repr`."""
    out: dict = {}
    for key, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key] = None
            out.setdefault(f"{key}_repr", repr(value))
        else:
            out[key] = value
    return json.dumps(out, allow_nan=False)


def decode_row(line: str) -> dict:
    """A metrics.jsonl line back as the row that was logged (non-finite floats restored);
    ValueError when the line is not a row (a JSON object with an integer `step`)."""
    row = json.loads(line)
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        raise ValueError("not a metrics row")
    for key, value in list(row.items()):
        spelled = row.get(f"{key}_repr")
        if value is None and isinstance(spelled, str):
            row[key] = float(spelled)
    return row


def read_metrics(path: str | Path) -> list[dict]:
    """The current rows of a metrics.jsonl, one per step in step order (see the module docstring).

    A last line without its newline is one a killed writer cut short, and is left out; any other
    line that is not a row raises ValueError naming the file and the line.
    """
    rows: list[dict] = []
    lines = Path(path).read_text().split("\n")
    for number, line in enumerate(lines[:-1], 1):  # the last piece is "" after a complete file's final newline
        if not line.strip():
            continue
        try:
            row = decode_row(line)
        except ValueError:
            raise ValueError(f"{path}:{number} is not a metrics row: {line[:80]!r}") from None
        while rows and rows[-1]["step"] >= row["step"]:
            rows.pop()  # superseded by a later run that started at or before that step
        rows.append(row)
    return rows


def file_stamp(path: str | Path) -> tuple[int, int] | None:
    """Which version of the file `path` is ((inode, mtime in ns); None: no file). A run that starts
    logging changes it, even into an empty file: `start` replaces an existing file by a new one."""
    try:
        st = Path(path).stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _scalars(row: dict) -> dict[str, float]:
    """The row's numeric columns (the step and the `_repr` spellings are not scalars to plot)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step" and not k.endswith("_repr") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def require_tensorboard() -> None:
    """ConfigError unless the tensorboard package is importable (metrics.tensorboard = true needs it)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "metrics.tensorboard = true needs the tensorboard package, which is not installed: "
            "pip install 'titan-onboard[tb]' (or pip install tensorboard)"
        )


class MetricsLogger:
    """Writes every step to metrics.jsonl and prints every `log_freq`-th step.

    Nothing is created until `start` (or the first `log`): a run refused before it trains
    leaves no folder and no file. `rows` keeps this run's rows as logged (floats as floats).
    `tensorboard`: also write each row's scalars as TensorBoard events (ConfigError here, on
    every rank, when the package is missing).
    """

    def __init__(self, output_dir: Path, *, log_freq: int = 1, use_rich: bool = True, enabled: bool = True,
                 console: bool = True, tensorboard: bool = False):
        self.enabled = enabled
        # a quiet run (a caller's own Trainer, no console) still writes its file: callers cite it as the run's record
        self.console_on = console
        self.log_freq = max(log_freq, 1)
        self.use_rich = use_rich
        self.console = Console(stderr=True, highlight=False)
        self.rows: list[dict] = []
        self.path = Path(output_dir) / "metrics.jsonl"
        self.tensorboard = tensorboard
        if tensorboard:
            require_tensorboard()  # every rank: a rank that alone failed would leave the others waiting
        self._file = None
        self._writer = None
        self._started = False

    def start(self, after_step: int = 0) -> None:
        """Begin this run's rows after step `after_step` (0: a fresh run; k: resumed from step k's
        checkpoint): the file keeps only the earlier rows with step <= after_step."""
        self._started = True
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # a fresh run keeps no row, so it need not read the old ones
            kept = [r for r in read_metrics(self.path) if r["step"] <= after_step] if after_step > 0 else []
            atomic_write_text(self.path, "".join(encode_row(r) + "\n" for r in kept))
        self._file = self.path.open("a")
        if self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # lazy: the [tb] extra, loaded only when asked for

            # purge_step: TensorBoard hides an earlier run's events from the step this run starts at, as
            # metrics.jsonl drops its superseded rows (a fresh run's folder may hold an old run's files)
            self._writer = SummaryWriter(str(self.path.parent / TENSORBOARD_DIR), purge_step=after_step + 1)

    def prints(self, step: int) -> bool:
        """Whether the console shows `step` (the first and every log_freq-th); the same on every rank."""
        return step == 1 or step % self.log_freq == 0

    def log(self, row: dict) -> None:
        if not self._started:
            self.start(row["step"] - 1)
        row = {**row, "loss_repr": repr(row["loss"]), "grad_norm_repr": repr(row["grad_norm"])}
        self.rows.append(row)
        if not self.enabled:
            return
        self._file.write(encode_row(row) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in _scalars(row).items():
                self._writer.add_scalar(key, value, row["step"])
        if self.console_on and (self.prints(row["step"]) or "val_loss" in row):
            shown = COLUMNS + [c for c in VAL_COLUMNS if c[0] in row]
            cells = [_fmt(k, row[k], f) for k, _, f in shown]
            if self.use_rich:
                self.console.print("  ".join(f"[bold]{name}[/] {c}" for (_, name, _), c in zip(shown, cells)))
            else:
                self.console.print("  ".join(f"{name}={c}" for (_, name, _), c in zip(shown, cells)))

    def summary_table(self) -> Table:
        table = Table(title="training metrics")
        shown = COLUMNS + [c for c in VAL_COLUMNS if any(c[0] in r for r in self.rows)]
        for _, name, _ in shown:
            table.add_column(name, justify="right")
        for row in self.rows:
            table.add_row(*[_fmt(k, row.get(k), f) for k, _, f in shown])
        return table

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()  # flushes the events still buffered
            self._writer = None
