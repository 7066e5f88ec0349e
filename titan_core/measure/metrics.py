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
"""

from __future__ import annotations

import json
import math
import os
import tempfile
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


def _rewrite(path: Path, rows: list[dict]) -> None:
    """Replace `path` by `rows`, atomically: a crash leaves the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(encode_row(r) + "\n" for r in rows)
        os.chmod(tmp, path.stat().st_mode & 0o777)  # mkstemp's 0600 would hide the file from others
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class MetricsLogger:
    """Writes every step to metrics.jsonl and prints every `log_freq`-th step.

    Nothing is created until `start` (or the first `log`): a run refused before it trains
    leaves no folder and no file. `rows` keeps this run's rows as logged (floats as floats).
    """

    def __init__(self, output_dir: Path, *, log_freq: int = 1, use_rich: bool = True, enabled: bool = True,
                 console: bool = True):
        self.enabled = enabled
        # a quiet run (a rung's own Trainer) still writes its file: the ledger names it as evidence
        self.console_on = console
        self.log_freq = max(log_freq, 1)
        self.use_rich = use_rich
        self.console = Console(stderr=True, highlight=False)
        self.rows: list[dict] = []
        self.path = Path(output_dir) / "metrics.jsonl"
        self._file = None
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
            _rewrite(self.path, kept)
        self._file = self.path.open("a")

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
        if self.console_on and self.prints(row["step"]):
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
        if self._file is not None and not self._file.closed:
            self._file.close()
