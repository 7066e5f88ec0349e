"""A full-size checkpoint checked against the native model without loading a byte of it.

`check_checkpoint_headers(weights_dir, meta_model, adapter)` reads only the safetensors
headers (onboard.sizing.checkpoint_headers), turns each declared tensor into a meta tensor of
its shape and dtype, maps those through the workspace adapter's `from_hf` (renames,
transposes, stacks and splits all work on meta) and compares the result with the native
model's state dict on meta. It names:

- missing: a native tensor no checkpoint tensor maps to;
- extra: a checkpoint tensor the adapter cannot map, or maps to a name the model lacks;
- wrong_shape: a native tensor whose mapped checkpoint shape differs from the model's;
- wrong_dtype: a checkpoint tensor whose dtype is not the declared one: the `dtype`
  argument, else config.json's `dtype` / `torch_dtype` in the weights folder, else the
  meta model's own dtype;
- problems: file and index integrity (a truncated shard, a tensor the index places in
  another shard, a tensor in two shards).

The lists are complete (a checkpoint of another model can name thousands): cap them for
display. Shapes are compared in the native layout, dtypes in the checkpoint's, so a model
built in fp32 on meta checks a bf16 checkpoint against its declared bf16.

Where the whole checkpoint does not map in one call, it is mapped one layer group at a
time (names sharing the prefix up to their first number, `model.layers.7.`), and a group
that fails is split into the tensors that map alone (renames) and the rest, which must map
together; a single tensor whose removal lets the rest map is the extra one. So one bad
tensor is named without hiding its layer; a group that still fails is reported whole,
with the adapter's message.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from onboard.sizing.checkpoint_headers import read_checkpoint_headers, read_index
from titan_core.config.hf_config import read_hf_config
from titan_core.memory.estimate import format_bytes
from titan_core.models.common.hf_adapter import TOP_KEYS

from onboard.parity.upstream import weight_files

INDEX = "model.safetensors.index.json"
_GROUP = re.compile(r"^(.*?\.\d+\.)")


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
    """Every tensor's dtype must be this one (see `check_checkpoint_headers`)."""
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


def check_checkpoint_headers(
    weights_dir: str | Path, meta_model: nn.Module, adapter: Any, *, dtype: str | torch.dtype | None = None
) -> HeaderReport:
    """Check every tensor of the checkpoint in `weights_dir` against `meta_model` through
    `adapter` (anything with `from_hf(sd)`: a family's HFAdapter, a workspace's ADAPTER or
    module). Reads headers only. UpstreamError (bad input) for a folder holding no checkpoint."""
    weights_dir = Path(weights_dir)
    files = weight_files(weights_dir)
    index = weights_dir / INDEX
    problems: list[str] = []
    weight_map = None
    if index.is_file():
        weight_map = read_index(index)
    headers = read_checkpoint_headers(files, weight_map)
    problems += headers.problems
    expected, source = _expected_dtype(weights_dir, meta_model, dtype, problems)
    report = HeaderReport(
        files=headers.files, tensors=len(headers.tensors), data_bytes=headers.nbytes, bytes_read=headers.bytes_read,
        dtype_expected=_name(expected), dtype_source=source, problems=problems,
    )  # fmt: skip
    own = meta_model.state_dict()
    hf = {name: t.meta() for name, t in headers.tensors.items()}
    head = _tied_head(hf, meta_model, report)
    mapping = _Mapping(adapter, hf)
    report.extra += mapping.unmapped
    for name in sorted(set(mapping.native) - set(own)):
        report.extra.append({"native": name, "hf": mapping.sources(name), "shape": list(mapping.native[name].shape),
                             "why": "the model has no such tensor"})  # fmt: skip
    for name in sorted(set(own) - set(mapping.native)):
        hf_names = _hf_names(adapter, name, own[name])
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
    return report


def _name(dt: torch.dtype | None) -> str | None:
    return None if dt is None else str(dt).removeprefix("torch.")


def _expected_dtype(weights_dir: Path, meta_model: nn.Module, dtype, problems: list[str]):
    """(dtype, where it came from): the argument, the folder's config.json, else the dtype
    the meta model's parameters were built in."""
    if dtype is not None:
        dt = _as_dtype(dtype, "the dtype argument", problems)
        if dt is not None:
            return dt, "argument"
    else:
        config = weights_dir / "config.json"
        cfg = read_hf_config(config) if config.is_file() else {}
        key = "dtype" if cfg.get("dtype") is not None else "torch_dtype"
        if cfg.get(key) is not None:
            dt = _as_dtype(cfg[key], f"{config} {key}", problems)
            if dt is not None:
                return dt, f"{config.name} {key}"
    own = next((p.dtype for p in meta_model.parameters() if p.is_floating_point()), torch.float32)
    return own, "the model's parameters (no declared dtype)"


def _as_dtype(value, what: str, problems: list[str]) -> torch.dtype | None:
    if isinstance(value, torch.dtype):
        return value
    dt = getattr(torch, str(value), None)
    if isinstance(dt, torch.dtype):
        return dt
    problems.append(f"{what} is {value!r}, not a torch dtype name (e.g. bfloat16)")
    return None


def _tied_head(hf: dict[str, torch.Tensor], meta_model: nn.Module, report: HeaderReport) -> str | None:
    """A tied model's checkpoint may store the head (`save_pretrained` drops it, others keep
    it): drop it before mapping, after checking it has the embedding's shape; its name, if dropped."""
    head, emb = TOP_KEYS["output.weight"], TOP_KEYS["tok_embeddings.weight"]
    if not getattr(getattr(meta_model, "args", None), "tie_embeddings", False) or head not in hf or emb not in hf:
        return None
    if hf[head].shape != hf[emb].shape:
        report.wrong_shape.append({"native": "tok_embeddings.weight", "hf": [head], "checkpoint": list(hf[head].shape),
                                   "model": list(hf[emb].shape)})  # fmt: skip
    hf.pop(head)
    return head


class _Mapping:
    """The checkpoint's meta tensors through `adapter.from_hf`, with unmappable tensors
    isolated and, on demand, which checkpoint tensors a native tensor came from."""

    def __init__(self, adapter: Any, hf: dict[str, torch.Tensor]):
        self.adapter, self.hf = adapter, hf
        self.native: dict[str, torch.Tensor] = {}
        self.unmapped: list[dict] = []
        self._alone: dict[str, dict | None] = {}
        self._groups: dict[str, list[str]] = {}
        for name in hf:
            m = _GROUP.match(name)
            self._groups.setdefault(m.group(1) if m else "", []).append(name)
        self._by_group: dict[str, set[str]] | None = None
        try:
            self.native = self._from_hf(hf)
            return
        except Exception:  # the adapter is workspace code: anything it raises is a mapping failure
            pass
        self._by_group = {}
        for prefix, names in self._groups.items():
            self._by_group[prefix] = set(self._map_group(names))

    def _from_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self.adapter.from_hf(sd)
        if not isinstance(out, dict):
            raise TypeError(f"from_hf returned {type(out).__name__}, not a dict")
        return out

    def _map_group(self, names: list[str]) -> dict[str, torch.Tensor]:
        try:
            out = self._from_hf({k: self.hf[k] for k in names})
        except Exception as e:
            out = self._split(names, e)
        self.native.update(out)
        return out

    def _split(self, names: list[str], error: Exception) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        together = []
        for k in names:
            alone = self.alone(k)
            if alone is None:
                together.append(k)
            else:
                out.update(alone)
        if not together:
            return out
        try:
            return {**out, **self._from_hf({k: self.hf[k] for k in together})}
        except Exception as e:
            error = e
        for k in together:  # one tensor whose removal lets the rest map is the extra one
            rest = [n for n in together if n != k]
            try:
                mapped = self._from_hf({n: self.hf[n] for n in rest})
            except Exception:
                continue
            self.unmapped.append({"native": None, "hf": [k], "shape": list(self.hf[k].shape), "why": _why(error)})
            return {**out, **mapped}
        self.unmapped.append({"native": None, "hf": sorted(together), "shape": None, "why": _why(error)})
        return out

    def alone(self, name: str) -> dict[str, torch.Tensor] | None:
        """What one checkpoint tensor maps to by itself (None: it maps only with others)."""
        if name not in self._alone:
            try:
                self._alone[name] = self._from_hf({name: self.hf[name]})
            except Exception:
                self._alone[name] = None
        return self._alone[name]

    def ignored(self, name: str) -> bool:
        """A tensor the adapter drops (a derived buffer such as rotary_emb.inv_freq)."""
        return self.alone(name) == {}

    def sources(self, native: str) -> list[str]:
        """The checkpoint tensors `native` came from: the one that maps to it alone, else
        the tensors of its layer group that map only together."""
        if self._by_group is None:
            self._by_group = {p: set(self._from_group_quiet(n)) for p, n in self._groups.items()}
        for prefix, produced in self._by_group.items():
            if native in produced:
                names = self._groups[prefix]
                direct = [k for k in names if native in (self.alone(k) or {})]
                return direct or sorted(k for k in names if self.alone(k) is None)
        return []

    def _from_group_quiet(self, names: list[str]) -> dict[str, torch.Tensor]:
        try:
            return self._from_hf({k: self.hf[k] for k in names})
        except Exception:
            return {}


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def _hf_names(adapter: Any, native: str, tensor: torch.Tensor) -> list[str]:
    """The checkpoint name(s) a missing native tensor would have (empty when it exports only
    together with others, e.g. one of a fused expert triple)."""
    try:
        names = sorted(adapter.to_hf({native: torch.empty_like(tensor, device="meta")}))
    except Exception:
        return []
    # a lone embedding exports as tied (the head emitted too); only its own name is meant
    return [n for n in names if n != TOP_KEYS["output.weight"]] or names
