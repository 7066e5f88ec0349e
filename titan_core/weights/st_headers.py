"""Safetensors headers: every tensor's name, dtype, shape and byte range, no tensor data read.

The format (safetensors' documented layout): an 8-byte little-endian unsigned length N, then
N bytes of UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets":
[begin, end]} (offsets into the data region that starts at byte 8 + N), plus an optional
"__metadata__" of strings; the data region follows, every byte of it belonging to exactly
one tensor, in offset order.

This module parses the header itself, through an unbuffered file, so exactly 8 + N bytes
are read per file (`FileHeader.header_bytes`); the data region is never read, seeked into or
mapped. (`safetensors.safe_open` also gives names, shapes and dtypes without reading tensor
bytes, but it memory-maps the whole file and refuses a file whose data region is short,
where a check wants to name the truncated shard and go on.)

A file that is not safetensors at all raises HeaderError; a header whose byte ranges
disagree with its dtypes and shapes, or with the file's size (a truncated download), is
read anyway and the disagreement recorded in `problems`, so one bad shard does not hide
what the others hold.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

HEADER_CAP = 100 * 2**20
"""Largest header accepted (safetensors' own limit): a bigger length field is not a header."""

# safetensors dtype code -> (bits per element, torch dtype name); names torch may lack are looked up lazily
DTYPES: dict[str, tuple[int, str]] = {
    "BOOL": (8, "bool"), "U8": (8, "uint8"), "I8": (8, "int8"), "F8_E5M2": (8, "float8_e5m2"),
    "F8_E4M3": (8, "float8_e4m3fn"), "F8_E8M0": (8, "float8_e8m0fnu"), "I16": (16, "int16"),
    "U16": (16, "uint16"), "F16": (16, "float16"), "BF16": (16, "bfloat16"), "I32": (32, "int32"),
    "U32": (32, "uint32"), "F32": (32, "float32"), "F64": (64, "float64"), "I64": (64, "int64"),
    "U64": (64, "uint64"), "C64": (64, "complex64"), "F4": (4, "float4_e2m1fn_x2"), "F6_E2M3": (6, ""),
    "F6_E3M2": (6, ""),
}  # fmt: skip


class HeaderError(ValueError):
    """A file that is not a readable safetensors file (message names the file and why)."""


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its header declares it."""

    name: str
    dtype: str
    """safetensors dtype code, e.g. "BF16"."""
    shape: tuple[int, ...]
    file: str
    """Name of the file holding it."""
    nbytes: int
    """Length of its byte range (end - begin)."""

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype of the code; None for a code this torch has no dtype for."""
        name = DTYPES.get(self.dtype, (0, ""))[1]
        value = getattr(torch, name, None) if name else None
        return value if isinstance(value, torch.dtype) else None

    @property
    def dtype_name(self) -> str:
        """The torch name ("bfloat16") where there is one, else the safetensors code."""
        dt = self.torch_dtype
        return str(dt).removeprefix("torch.") if dt is not None else self.dtype

    def meta(self) -> torch.Tensor:
        """A meta tensor of this shape and dtype (uint8 for a dtype torch lacks): no memory."""
        return torch.empty(self.shape, dtype=self.torch_dtype or torch.uint8, device="meta")


@dataclass
class FileHeader:
    path: Path
    tensors: dict[str, TensorHeader]
    metadata: dict[str, str]
    header_bytes: int
    """Bytes read from the file: the 8-byte length and the JSON."""
    problems: list[str] = field(default_factory=list)


@dataclass
class CheckpointHeaders:
    """The headers of all files of one checkpoint, merged by tensor name."""

    files: list[str]
    tensors: dict[str, TensorHeader]
    problems: list[str]
    """File and index integrity: unreadable files, byte ranges, index disagreements."""
    bytes_read: int
    """Bytes read over all files (headers only)."""

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data the headers declare (what loading would read)."""
        return sum(t.nbytes for t in self.tensors.values())


def _read_exact(f, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = f.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def read_header(path: str | Path) -> FileHeader:
    """The header of one safetensors file, reading only its first 8 + N bytes."""
    path = Path(path)
    try:
        size = path.stat().st_size
        # unbuffered: a buffered reader would read ahead into the tensor data
        with open(path, "rb", buffering=0) as f:
            head = _read_exact(f, 8)
            if len(head) < 8:
                raise HeaderError(f"{path}: {size} bytes, shorter than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > HEADER_CAP or n > size - 8:
                raise HeaderError(f"{path}: header length {n} exceeds the file ({size} bytes) or the 100 MiB cap")
            raw = _read_exact(f, n)
    except OSError as e:
        raise HeaderError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        table = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HeaderError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(table, dict):
        raise HeaderError(f"{path}: header is not a JSON object")
    metadata = table.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise HeaderError(f"{path}: __metadata__ is not an object of strings")
    tensors, spans, problems = {}, [], []
    for name, entry in table.items():
        tensors[name] = t = _entry(path, name, entry)
        begin, end = entry["data_offsets"]
        spans.append((begin, end, name))
        bits = DTYPES.get(t.dtype, (0, ""))[0]
        want = math.prod(t.shape) * bits
        if bits and want != 8 * t.nbytes:
            problems.append(
                f"{path.name}: {name}: {t.dtype} {list(t.shape)} needs {want / 8:g} bytes, "
                f"its data_offsets span {t.nbytes}"
            )
        elif not bits:
            problems.append(f"{path.name}: {name}: unknown dtype {t.dtype!r}")
    problems += _span_problems(path, spans, size - 8 - n)
    return FileHeader(path=path, tensors=tensors, metadata=metadata, header_bytes=8 + n, problems=problems)


def _entry(path: Path, name: str, entry) -> TensorHeader:
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and all(_uint(d) for d in entry["shape"])
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and all(_uint(o) for o in entry["data_offsets"])
        and entry["data_offsets"][0] <= entry["data_offsets"][1]
    )
    if not ok:
        raise HeaderError(f"{path}: tensor {name!r}: not {{dtype, shape, data_offsets: [begin <= end]}}: {entry!r}")
    begin, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    return TensorHeader(name=name, dtype=entry["dtype"], shape=shape, file=path.name, nbytes=end - begin)


def _uint(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _span_problems(path: Path, spans: list[tuple[int, int, str]], data_size: int) -> list[str]:
    """The byte ranges must tile the data region in order, as safetensors requires."""
    out, cursor = [], 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            what = "overlaps the previous tensor" if begin < cursor else f"leaves a gap after byte {cursor}"
            out.append(f"{path.name}: {name} starts at data byte {begin} and {what}")
        cursor = max(cursor, end)
    if cursor > data_size:
        out.append(f"{path.name}: the header declares {cursor} data bytes, the file holds {data_size}: truncated")
    elif cursor < data_size:
        out.append(f"{path.name}: {data_size - cursor} bytes after the last tensor belong to none")
    return out


def read_index(path: str | Path) -> dict[str, str]:
    """The weight_map ({tensor: shard file}) of a model.safetensors.index.json."""
    path = Path(path)
    try:
        weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HeaderError(f"{path}: not a safetensors index (no weight_map): {e}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise HeaderError(f"{path}: weight_map is not an object of shard file names")
    return weight_map


def read_checkpoint_headers(files: list[str | Path], weight_map: dict[str, str] | None = None) -> CheckpointHeaders:
    """Every tensor of the checkpoint made of `files`, from their headers alone.

    With the index's `weight_map`, each tensor must sit in the shard the index names, and
    every tensor of a shard must be in the index. A file that cannot be read is a problem
    (its tensors are then absent), not an exception.
    """
    tensors: dict[str, TensorHeader] = {}
    problems: list[str] = []
    read = 0
    for path in files:
        try:
            header = read_header(path)
        except HeaderError as e:
            problems.append(str(e))
            continue
        read += header.header_bytes
        problems += header.problems
        for name, t in header.tensors.items():
            if name in tensors:
                problems.append(f"{name} is in both {tensors[name].file} and {t.file}")
                continue
            tensors[name] = t
    if weight_map is not None:
        problems += _index_problems(tensors, weight_map, {Path(p).name for p in files})
    return CheckpointHeaders(files=[Path(p).name for p in files], tensors=tensors, problems=problems, bytes_read=read)


def _index_problems(tensors: dict[str, TensorHeader], weight_map: dict[str, str], readable: set[str]) -> list[str]:
    out = []
    for name, shard in weight_map.items():
        t = tensors.get(name)
        if t is None:
            if shard in readable:
                out.append(f"the index maps {name} to {shard}, whose header lacks it")
        elif t.file != shard:
            out.append(f"the index maps {name} to {shard}, but it is in {t.file}")
    out += [f"{name} is in {t.file} but not in the index" for name, t in tensors.items() if name not in weight_map]
    return out
