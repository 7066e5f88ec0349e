"""A full-size checkpoint checked against the native model without loading a byte of it.

`check_headers(weights_dir, files, meta_model, adapter)` reads only the safetensors headers
(titan_core/weights/st_headers.py), turns each declared tensor into a meta tensor of its shape
and dtype, maps those through the adapter's `from_hf` (renames, transposes, stacks and splits
all work on meta) and compares the result with the native model's state dict on meta. It names:

- missing: a native tensor no checkpoint tensor maps to;
- extra: a checkpoint tensor the adapter cannot map, or maps to a name the model lacks;
- wrong_shape: a native tensor whose mapped checkpoint shape differs from the model's;
- wrong_dtype: a checkpoint tensor whose dtype is not the declared one: the `dtype`
  argument, else config.json's `dtype` / `torch_dtype` in the weights folder, else the
  checkpoint's own (the floating dtype most of its elements are in, from the headers: a
  config need not say), else the meta model's;
- problems: file and index integrity (a truncated shard, a tensor the index places in
  another shard, a tensor in two shards).

The adapter maps the checkpoint's names; one that offers `checkpoint_reader(model)` maps them
through what it returns (the transformers path: transformers' own loading conversions of the
model's class, so a checkpoint in the Hub's layout maps as `from_pretrained` maps it).

The lists are complete (a checkpoint of another model can name thousands): cap them for
display. Shapes are compared in the native layout, dtypes in the checkpoint's, so a model
built in fp32 on meta checks a bf16 checkpoint against its declared bf16.

A checkpoint that does not map in one call is mapped a layer group at a time, a bad tensor
isolated (titan_core/weights/name_mapping.py). `checked_mapping` returns the mapping with the
report, so a loader reads the tensors the check has just mapped (titan_core/training/hf_load.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from titan_core.config.hf_config import read_hf_config
from titan_core.config.loader import ConfigError
from titan_core.memory.estimate import format_bytes
from titan_core.models.common.hf_adapter import TOP_KEYS
from titan_core.config.hf_keys import hf_key
from titan_core.weights.name_mapping import CheckpointMapping
from titan_core.weights.st_headers import CheckpointHeaders, read_checkpoint_headers, read_index

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class HeaderReport:
    """What the headers say against the model; `ok` when every list is empty."""

    files: list[str]
    tensors: int
    data_bytes: int
    """Bytes of tensor data the headers declare (none of them read)."""
    bytes_read: int
    """Bytes actually read: the headers."""
    dtype_expected: str
    """Every tensor's dtype must be this one (see `check_headers`)."""
    dtype_source: str
    missing: list[dict] = field(default_factory=list)
    extra: list[dict] = field(default_factory=list)
    wrong_shape: list[dict] = field(default_factory=list)
    wrong_dtype: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.wrong_shape or self.wrong_dtype or self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def summary(self) -> str:
        """One line: the counts, and the first of each kind by name."""
        head = f"{self.tensors} tensors in {len(self.files)} file(s), {format_bytes(self.data_bytes)} declared"
        if self.ok:
            return f"{head}: every tensor maps, shapes and dtypes agree"
        parts = []
        for kind in ("missing", "extra", "wrong_shape", "wrong_dtype"):
            items = getattr(self, kind)
            if items:
                native, hf = items[0].get("native"), ", ".join((items[0].get("hf") or [])[:3])
                first = f"{native} <- {hf}" if native and hf else native or hf or "?"
                parts.append(f"{len(items)} {kind.replace('_', ' ')} (first: {first})")
        if self.problems:
            parts.append(f"{len(self.problems)} file/index problem(s) (first: {self.problems[0]})")
        return f"{head}: " + "; ".join(parts)


@dataclass
class CheckedCheckpoint:
    """The header check's report and what it mapped (for a loader to read by)."""

    report: HeaderReport
    headers: CheckpointHeaders
    hf: dict[str, torch.Tensor]
    """{checkpoint name: meta tensor} of what is mapped (a tied model's stored head left out)."""
    mapping: CheckpointMapping
    """`mapping.native`: {native name: meta tensor}, each the adapter's output for `hf`'s tensors."""
    reader: Any
    """What mapped the names: the adapter, or what its `checkpoint_reader(model)` returned."""


def checkpoint_files(weights_dir: str | Path) -> list[Path]:
    """The safetensors files of a Hugging Face model folder: model.safetensors, or the shards its
    model.safetensors.index.json names. ConfigError naming the folder, the index or the absent shard."""
    folder = Path(weights_dir)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder (a Hugging Face model folder with config.json and safetensors)")
    index = folder / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{index}: not a safetensors index (no weight_map): {e}") from None
        absent = [s for s in shards if not (folder / s).is_file()]
        if absent:
            raise ConfigError(f"{index} names shard(s) missing from {folder}: {', '.join(absent[:4])}")
        return [folder / s for s in shards]
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    if found:
        raise ConfigError(
            f"{folder} holds {', '.join(found[:4])}{' ...' if len(found) > 4 else ''} but neither {SINGLE} nor "
            f"{INDEX}: a sharded checkpoint needs its index"
        )
    raise ConfigError(f"{folder}: no *.safetensors files")


def check_headers(
    weights_dir: str | Path, files: list[Path], meta_model: TrainableModel, adapter: Any, *, dtype=None
) -> HeaderReport:
    """Check every tensor of the checkpoint made of `files` (in `weights_dir`) against
    `meta_model` through `adapter` (anything with `from_hf(sd)`: a family's HFAdapter, a
    model.adapter_file's ADAPTER or module). Reads headers only."""
    return checked_mapping(weights_dir, files, meta_model, adapter, dtype=dtype).report


def checked_mapping(
    weights_dir: str | Path, files: list[Path], meta_model: TrainableModel, adapter: Any, *, dtype=None
) -> CheckedCheckpoint:
    """`check_headers`, with the mapping it made (`CheckedCheckpoint`)."""
    weights_dir = Path(weights_dir)
    index = weights_dir / INDEX
    problems: list[str] = []
    weight_map = read_index(index) if index.is_file() else None
    headers = read_checkpoint_headers(files, weight_map)
    problems += headers.problems
    expected, source = _expected_dtype(weights_dir, meta_model, dtype, headers, problems)
    report = HeaderReport(
        files=headers.files, tensors=len(headers.tensors), data_bytes=headers.nbytes, bytes_read=headers.bytes_read,
        dtype_expected=_name(expected), dtype_source=source, problems=problems,
    )  # fmt: skip
    own = meta_model.state_dict()
    hf = {name: t.meta() for name, t in headers.tensors.items()}
    head = _tied_head(hf, meta_model, report)
    reader = _reader(adapter, meta_model)
    mapping = CheckpointMapping(reader, hf, own)
    report.extra += mapping.unmapped
    for name in sorted(set(mapping.native) - set(own)):
        report.extra.append({"native": name, "hf": mapping.sources(name), "shape": list(mapping.native[name].shape),
                             "why": "the model has no such tensor"})  # fmt: skip
    for name in sorted(set(own) - set(mapping.native)):
        hf_names = _hf_names(reader, name, own[name])
        report.missing.append({"native": name, "hf": hf_names, "shape": list(own[name].shape)})
    for name in sorted(set(own) & set(mapping.native)):
        got, want = tuple(mapping.native[name].shape), tuple(own[name].shape)
        if got != want:
            report.wrong_shape.append(
                {"native": name, "hf": mapping.sources(name), "checkpoint": list(got), "model": list(want)}
            )
    reported = {k for item in report.extra for k in item.get("hf") or []}
    for name, t in sorted(headers.tensors.items()):
        # a tensor the adapter drops (a derived buffer) has no dtype to keep; a stored tied head does
        if name not in reported and t.torch_dtype != expected and (name == head or not mapping.ignored(name)):
            item = {"hf": [name], "dtype": t.dtype_name, "expected": _name(expected), "file": t.file}
            report.wrong_dtype.append(item)
    return CheckedCheckpoint(report=report, headers=headers, hf=hf, mapping=mapping, reader=reader)


def _name(dt: torch.dtype | None) -> str | None:
    return None if dt is None else str(dt).removeprefix("torch.")


def _reader(adapter: Any, meta_model: nn.Module) -> Any:
    """What maps a checkpoint of `meta_model`: the adapter's `checkpoint_reader(model)` where it
    has one, else the adapter itself."""
    bind = getattr(adapter, "checkpoint_reader", None)
    return bind(meta_model) if callable(bind) else adapter


def _expected_dtype(weights_dir: Path, meta_model: nn.Module, dtype, headers: CheckpointHeaders, problems: list[str]):
    """(dtype, where it came from): the argument, the folder's config.json, the checkpoint's own
    (`_headers_dtype`), else the dtype the meta model's parameters were built in."""
    if dtype is not None:
        dt = _as_dtype(dtype, "the dtype argument", problems)
        if dt is not None:
            return dt, "argument"
    else:
        config = weights_dir / "config.json"
        cfg = read_hf_config(config) if config.is_file() else {}
        key = hf_key("dtype", cfg)  # transformers 5 writes `dtype`, 4.x `torch_dtype` (the HF-name table)
        if cfg.get(key) is not None:
            dt = _as_dtype(cfg[key], f"{config} {key}", problems)
            if dt is not None:
                return dt, f"{config.name} {key}"
    stored = _headers_dtype(headers)
    if stored is not None:
        return stored, "the checkpoint's headers (no declared dtype: the one most of its elements are in)"
    own = next((p.dtype for p in meta_model.parameters() if p.is_floating_point()), torch.float32)
    return own, "the model's parameters (no declared dtype)"


def _headers_dtype(headers: CheckpointHeaders) -> torch.dtype | None:
    """The floating dtype holding most of the checkpoint's elements (as transformers' `dtype="auto"`
    takes the checkpoint's own where the config has none), or None without a floating tensor.
    A tensor in another dtype is then the odd one out, named as a wrong dtype."""
    elements: Counter[torch.dtype] = Counter()
    for t in headers.tensors.values():
        if t.torch_dtype is not None and t.torch_dtype.is_floating_point:
            elements[t.torch_dtype] += math.prod(t.shape)
    if not elements:
        return None
    return max(elements, key=lambda dt: (elements[dt], str(dt)))  # a tie: one fixed answer


def _as_dtype(value, what: str, problems: list[str]) -> torch.dtype | None:
    if isinstance(value, torch.dtype):
        return value
    dt = getattr(torch, str(value), None)
    if isinstance(dt, torch.dtype):
        return dt
    problems.append(f"{what} is {value!r}, not a torch dtype name (e.g. bfloat16)")
    return None


def _tied_head(hf: dict[str, torch.Tensor], meta_model: TrainableModel, report: HeaderReport) -> str | None:
    """A tied model's checkpoint may store the head (`save_pretrained` drops it, others keep
    it): drop it before mapping, after checking it has the embedding's shape; its name, if dropped."""
    head, emb = TOP_KEYS["output.weight"], TOP_KEYS["tok_embeddings.weight"]
    if not meta_model.args.tie_embeddings or head not in hf or emb not in hf:
        return None
    if hf[head].shape != hf[emb].shape:
        report.wrong_shape.append({"native": "tok_embeddings.weight", "hf": [head], "checkpoint": list(hf[head].shape),
                                   "model": list(hf[emb].shape)})  # fmt: skip
    hf.pop(head)
    return head


def _hf_names(adapter: Any, native: str, tensor: torch.Tensor) -> list[str]:
    """The checkpoint name(s) a missing native tensor would have (empty when it exports only
    together with others, e.g. one of a fused expert triple)."""
    try:
        names = sorted(adapter.to_hf({native: torch.empty_like(tensor, device="meta")}))
    except Exception:
        return []
    # a lone embedding exports as tied (the head emitted too); only its own name is meant
    return [n for n in names if n != TOP_KEYS["output.weight"]] or names
