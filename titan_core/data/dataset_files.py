"""The files of `data.source = "dataset"`, opened as a streaming `datasets` IterableDataset, and
what a row holds.

`data.path` is a file, a folder (every data file under it, recursively) or a glob; the files
are sorted by path and must be of one kind, chosen by extension:

- `.jsonl` / `.ndjson`, and `.json` files that hold JSON Lines (their first character is
  `{`): read line by line through the `text` builder and parsed here, so a broken line is
  one bad row, not a failed run;
- `.json` holding an array: the `json` builder (each file is parsed whole);
- `.parquet`: the `parquet` builder, reading only the needed column;
- `.txt`: the `text` builder by paragraph (blank-line separated, as data.source = 'text').

Everything streams (`streaming=True`): rows are read as they are consumed, never the whole
corpus. Non-UTF-8 bytes in a line-based file are replaced, not fatal.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan_core.config.loader import ConfigError
from titan_core.data.chat import BadRow, check_messages

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "text"}
PROBE_ROWS = 1000
"""Rows read before training to check that the field exists and to count the usable ones."""

BAD_REASONS = {
    "broken_json": "broken JSON line",
    "not_object": "not a JSON object",
    "missing": "field missing or null",
    "non_string": "field of the wrong type",
    "empty": "empty",
    "malformed": "a message without string role / content",
    "no_assistant": "no assistant message",
    "template_error": "refused by the chat template",
    "not_prefix_stable": "chat template rewrites earlier turns",
    "truncated": "no assistant token within seq_len",
}
"""Why a row was skipped (the keys the loader counts) and how the report says it."""

SKIP = object()
"""A row that is no document and no error: a blank line of a JSONL file or a blank paragraph."""


@dataclass
class DataFiles:
    path: str
    """data.path as given."""
    files: list[Path]
    """The files it names, sorted by path."""
    kind: str
    """jsonl, json, parquet or text: how they are read (module docstring)."""

    def where(self) -> str:
        """The file, or the path and how many files it matched: for messages."""
        return f"'{self.files[0]}'" if len(self.files) == 1 else f"'{self.path}' ({len(self.files)} files)"

    def digest(self) -> str:
        """Names (relative to their common folder) and sizes: a resume must read the same files,
        wherever the run folder moved."""
        root = os.path.commonpath([str(f.parent) for f in self.files])
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{os.path.relpath(f, root)}:{f.stat().st_size};".encode())
        return h.hexdigest()[:16]


def _sniff(file: Path) -> str:
    """The first non-blank character of a file ('' when it has none)."""
    with open(file, "rb") as fh:
        while chunk := fh.read(4096):
            text = chunk.lstrip()
            if text:
                return text[:1].decode("latin-1")
    return ""


def find_data_files(path: str, *, what: str = "data.path") -> DataFiles:
    """The data files `path` names (module docstring); a ConfigError when there are none."""
    if not path:
        raise ConfigError(f"{what} is empty: data.source = 'dataset' needs a data file, a folder or a glob")
    p = Path(path).expanduser()
    if any(c in path for c in "*?["):
        files = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
        if not files:
            raise ConfigError(f"{what} '{path}' matches no file")
    elif p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES)
        if not files:
            raise ConfigError(f"{what} '{path}' holds no data file ({', '.join(SUFFIXES)})")
    else:
        raise ConfigError(f"{what} '{path}' does not exist")
    kinds = {f.suffix.lower() for f in files}
    unknown = sorted(kinds - set(SUFFIXES))
    if unknown:
        raise ConfigError(f"{what} '{path}': {unknown[0]} files are not data files (read: {', '.join(SUFFIXES)})")
    kinds = {SUFFIXES[k] for k in kinds}
    if len(kinds) > 1:
        raise ConfigError(f"{what} '{path}' mixes {' and '.join(sorted(kinds))} files: point it at one kind")
    kind = kinds.pop()
    if kind == "json" and all(_sniff(f) in ("{", "") for f in files):
        kind = "jsonl"  # JSON Lines under a .json name: read line by line, like .jsonl
    return DataFiles(path, files, kind)


def open_dataset(files: DataFiles, column: str):
    """The unsharded streaming IterableDataset of the files (one shard per file)."""
    try:
        import datasets  # lazy: the [hf] extra, seconds to import: only a dataset source loads it
    except ImportError:
        raise ConfigError("data.source = 'dataset' needs the datasets package: pip install titan-onboard[hf]") from None

    datasets.disable_progress_bars()
    names = [str(f) for f in files.files]
    if files.kind in ("jsonl", "text"):
        sample_by = "line" if files.kind == "jsonl" else "paragraph"
        return datasets.load_dataset("text", data_files=names, split="train", streaming=True,
                                     sample_by=sample_by, encoding_errors="replace")  # fmt: skip
    if files.kind == "parquet":
        _check_parquet_column(files, column)
        return datasets.load_dataset("parquet", data_files=names, split="train", streaming=True, columns=[column])
    return datasets.load_dataset("json", data_files=names, split="train", streaming=True)


def _check_parquet_column(files: DataFiles, column: str) -> None:
    import pyarrow.parquet as pq  # lazy: comes with the [hf] extra (datasets), only for parquet files

    for f in files.files:
        try:
            names = pq.read_schema(f).names
        except Exception as e:  # pyarrow raises its own errors for a file that is no parquet
            raise ConfigError(f"data file '{f}' cannot be read as parquet: {e}") from None
        if column not in names:
            raise ConfigError(f"data file '{f}' has no column '{column}' (columns: {', '.join(names)})")


def row_value(example: dict[str, Any], kind: str, column: str) -> Any:
    """The row's value of `column` (its text or its messages), `SKIP`, or BadRow."""
    if kind == "text":
        text = example["text"].strip("\n")
        return text if text.strip() else SKIP
    if kind == "jsonl":
        line = example["text"]
        if not line.strip():
            return SKIP
        try:
            example = json.loads(line)
        except json.JSONDecodeError:
            raise BadRow("broken_json") from None
        if not isinstance(example, dict):
            raise BadRow("not_object")
    value = example.get(column)
    if value is None:
        raise BadRow("missing")
    return value


def text_of(value: Any) -> str:
    """A text row's document, or BadRow."""
    if not isinstance(value, str):
        raise BadRow("non_string")
    if not value.strip():
        raise BadRow("empty")
    return value


@dataclass
class Probe:
    """What the first PROBE_ROWS rows of the files hold (every rank reads the same ones)."""

    rows: int
    """Non-blank rows read."""
    valid: int
    """Of them, rows whose value is a document (text) or a well-formed conversation (chat)."""
    bad: Counter
    """The others, by reason (BAD_REASONS' keys)."""
    complete: bool
    """The files ended within PROBE_ROWS rows: the counts are the whole corpus's."""

    def where(self, files: DataFiles) -> str:
        return f"data file {files.where()}" if self.complete else f"the first {self.rows} rows of {files.where()}"


def probe(files: DataFiles, column: str, *, chat: bool) -> Probe:
    """Read the first PROBE_ROWS rows (of all ranks together) and count them: a ConfigError when there
    is no row, or when no row has `column` (a .txt corpus has its text by construction)."""
    ds = open_dataset(files, column)
    rows, has, seen_keys, broken, read, bad = 0, 0, set(), 0, 0, Counter()
    for example in ds.take(PROBE_ROWS):
        read += 1
        try:
            value = row_value(example, files.kind, column)
            if value is SKIP:
                continue
            has += 1
            if chat:
                check_messages(value)
            else:
                text_of(value)
        except BadRow as why:
            broken += why.reason == "broken_json"
            bad[why.reason] += 1
        rows += 1
        if files.kind == "jsonl":
            try:
                obj = json.loads(example["text"])
                seen_keys |= set(obj) if isinstance(obj, dict) else set()
            except json.JSONDecodeError:
                pass
        elif files.kind == "json" or files.kind == "parquet":
            seen_keys |= {k for k, v in example.items() if v is not None}
    if rows == 0:
        raise ConfigError(f"data file {files.where()} holds no rows (it is empty or blank)")
    if not has:
        name = "data.field" if not chat else "data.format = 'chat' reads the column"
        detail = f"columns seen: {', '.join(sorted(seen_keys)) or 'none'}"
        if broken:
            detail += f"; {broken} of the {rows} rows are broken JSON lines"
        raise ConfigError(f"{name} '{column}': no row of the first {rows} of {files.where()} has it ({detail})")
    return Probe(rows, rows - sum(bad.values()), bad, complete=read < PROBE_ROWS)
