"""`checkpoint.initial_hf`: a run starts from a Hugging Face checkpoint, each rank reading only its part.

`initial_weights(cfg, meta_model)` runs before anything is allocated, on the recipe's model on
meta: it reads the folder's config.json (a checkpoint of another model_type is refused) and the
safetensors headers, and maps them through the recipe's adapter (`model_adapter`, as the export
does; the transformers path through its `checkpoint_reader`) with the header check of
titan_core/weights/header_check.py, whose missing, extra, wrong-shape and wrong-dtype tensors are
the load's ConfigError, naming the file. It returns None when the recipe names no checkpoint, or
when the run will resume from its own checkpoint (which takes precedence).

`InitialWeights.load(model)` then fills the materialised (and parallelised) model in place:

- a native tensor that is a checkpoint tensor renamed, or a view of one (transposed, sliced,
  one expert of a stack: titan_core/weights/strided.py), is read through safetensors' lazy
  `get_slice`, only the box this rank's shard holds, one file open at a time;
- any other (a concatenation or stack of several checkpoint tensors) is converted from real
  tensors one layer group at a time (the names up to the first number, `model.layers.7.`) and
  only the rank's box kept;

so no process holds more than one layer group of full tensors beside its own shards. The values
are converted once, into each parameter's dtype, by the copy into it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from titan_core.config.hf_config import read_hf_config
from titan_core.config.loader import ConfigError
from titan_core.config.sections import JobConfig
from titan_core.memory.estimate import format_bytes
from titan_core.models.model_builder import model_adapter
from titan_core.weights.header_check import CheckedCheckpoint, checked_mapping, checkpoint_files
from titan_core.weights.name_mapping import layer_groups
from titan_core.weights.st_headers import HeaderError
from titan_core.weights.strided import ViewMap, arrange, local_box, source_box, view_map

SHOWN = 4
"""Offending tensors a refusal names (its counts say how many there are in all)."""
MAPPED = 8 * 2**20
"""Bytes read through one opening of a file before it is opened again (`_Handles`), and the size of
the pieces a large tensor is read in: what a read holds in memory beyond the rank's own shards."""


@dataclass
class LoadStats:
    """What `InitialWeights.load` read."""

    folder: str
    tensors: int
    """Tensors in the checkpoint."""
    nbytes: int
    """Bytes of tensor data in the checkpoint."""
    bytes_read: int = 0
    """Bytes of tensor data this process read (its shards' boxes, and the layer groups it converted)."""
    seconds: float = 0.0

    def line(self) -> str:
        return f"loaded initial weights from {self.folder} ({self.tensors} tensors, {format_bytes(self.nbytes)})"


@dataclass
class _Direct:
    native: str
    hf: str
    view: ViewMap


@dataclass
class _Group:
    hf: list[str]
    native: list[str] = field(default_factory=list)


@dataclass
class InitialWeights:
    """A checked checkpoint and how each native tensor is read from it (module docstring)."""

    folder: Path
    checked: CheckedCheckpoint
    direct: list[_Direct]
    groups: list[_Group]

    def load(self, model: nn.Module, *, stages: bool = False) -> LoadStats:
        """Fill `model` (materialised; plain or DTensor parameters) from the checkpoint, in place.

        `stages`: `model` holds this rank's pipeline stages only (parallel/pipeline.py cut it from the
        checked model): the tensors of the other stages are neither refused nor read."""
        start = time.perf_counter()
        report = self.checked.report
        stats = LoadStats(str(self.folder), report.tensors, report.data_bytes)
        targets = dict(model.state_dict(keep_vars=True))
        wanted = [d.native for d in self.direct] + [n for g in self.groups for n in g.native]
        absent = [n for n in wanted if n not in targets]
        if absent and not stages:
            raise ConfigError(f"the model built here has no {', '.join(absent[:SHOWN])}: it is not the model checked")
        direct = [d for d in self.direct if d.native in targets]
        groups = [_Group(g.hf, [n for n in g.native if n in targets]) for g in self.groups]
        done: set[int] = set()  # a tied tensor under two names is filled once
        handles = _Handles(self._files())
        try:
            with torch.no_grad():
                for d in sorted(direct, key=lambda d: self._file_of(d.hf)):  # each file opened in turn
                    if id(targets[d.native]) not in done:
                        done.add(id(targets[d.native]))
                        header = self.checked.headers.tensors[d.hf]
                        stats.bytes_read += _read_direct(handles, header, d, targets[d.native])
                handles.close()
                for group in groups:
                    if not group.native:  # another stage's
                        continue
                    tensors = self._read_whole(group.hf, handles)
                    stats.bytes_read += sum(t.numel() * t.element_size() for t in tensors.values())
                    converted = self.checked.reader.from_hf(tensors)
                    for n in group.native:
                        if id(targets[n]) not in done:
                            done.add(id(targets[n]))
                            _copy_local(targets[n], converted[n])
                    del tensors, converted
                    handles.close()  # the group's mapped pages go with it
        finally:
            handles.close()
        stats.seconds = time.perf_counter() - start
        return stats

    def _files(self) -> dict[str, Path]:
        return {name: self.folder / name for name in self.checked.report.files}

    def _file_of(self, hf: str) -> str:
        return self.checked.headers.tensors[hf].file

    def _read_whole(self, names: list[str], handles: _Handles) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for n in sorted(names, key=self._file_of):
            header = self.checked.headers.tensors[n]
            out[n] = handles.get(header.file, 0).get_tensor(n)
        return out


class _Handles:
    """One safetensors file open at a time, opened again once MAPPED bytes of it were read: the pages
    a read touches stay in the process's memory while the file is mapped, so this bounds them."""

    def __init__(self, paths: dict[str, Path]):
        self.paths = paths
        self.name: str | None = None
        self.f = None
        self.touched = 0

    def get(self, name: str, nbytes: int):
        """The open file `name`, about to have `nbytes` read from it."""
        if self.f is not None and (name != self.name or self.touched + nbytes > MAPPED):
            self.close()
        if self.f is None:
            self.f = _open(self.paths[name]).__enter__()
            self.name, self.touched = name, 0
        self.touched += nbytes
        return self.f

    def close(self) -> None:
        if self.f is not None:
            f, self.f = self.f, None
            f.__exit__(None, None, None)


def _open(path: Path):
    """safetensors' lazy reader of one file (memory-mapped: a slice reads only its bytes)."""
    try:
        from safetensors import safe_open  # lazy: the [hf] extra
    except ImportError:
        raise ConfigError("loading checkpoint.initial_hf needs safetensors: pip install titan-onboard[hf]") from None
    return safe_open(str(path), framework="pt", device="cpu")


def _local(param: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores for `param` (under no_grad: its storage itself)."""
    return param.to_local() if isinstance(param, DTensor) else param


def _read_direct(handles: _Handles, header, d: _Direct, param: torch.Tensor) -> int:
    """Read the part of `param` this rank holds from checkpoint tensor `d.hf` (described by `header`),
    in pieces of about MAPPED bytes along its first dim; returns the bytes read."""
    box = local_box(param)
    if box is None or not box:  # no box of its own (the full tensor, distributed here), or a scalar
        full = arrange(d.view, handles.get(header.file, header.nbytes).get_tensor(d.hf), param.shape)
        _copy_local(param, full)
        return header.nbytes
    if any(size == 0 for _, size in box):
        return 0
    sizes = [size for _, size in box]
    # the file bytes one view row spans (a box narrow in a trailing dim still maps every page of its rows)
    row = _span_bytes(header, source_box(d.view, [(box[0][0], 1), *box[1:]]))
    step = max(1, int(MAPPED // max(row, 1)))
    local, read = _local(param), 0
    for o in range(0, sizes[0], step):
        k = min(step, sizes[0] - o)
        part = [(box[0][0] + o, k), *box[1:]]
        where = source_box(d.view, part)
        # a view of the mapped file: the copy below is the one read, converting to the parameter's dtype
        data = handles.get(header.file, _span_bytes(header, where)).get_slice(d.hf)[where]
        local[o : o + k].copy_(arrange(d.view, data, [k, *sizes[1:]]))
        read += data.numel() * data.element_size()
        del data
    return read


def _span_bytes(header, where: tuple[slice, ...]) -> int:
    """Bytes of the file from the first to the last element of the box `where` of tensor `header`
    (row-major): the pages reading the box maps, whichever of them it needs."""
    if not header.shape:
        return header.nbytes
    stride, first, last = 1, 0, 0
    for n, s in zip(reversed(header.shape), reversed(where)):
        first += s.start * stride
        last += (s.stop - 1) * stride
        stride *= n
    return (last - first + 1) * header.nbytes // max(1, math.prod(header.shape))


def _copy_local(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the full tensor `full` into `param`."""
    if tuple(full.shape) != tuple(param.shape):
        raise ConfigError(f"a converted tensor has shape {list(full.shape)}, the parameter {list(param.shape)}")
    box = local_box(param)
    if box is None:
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
    else:
        local = full[tuple(slice(o, o + n) for o, n in box)]
    _local(param).copy_(local)


def _resume_due(cfg: JobConfig) -> bool:
    if not (cfg.checkpoint.enable and cfg.checkpoint.resume):
        return False
    from titan_core.training.checkpoint import Checkpointer  # lazy: checkpoint.py is only needed to resume

    return Checkpointer.from_config(cfg).latest_step() is not None


def initial_weights(cfg: JobConfig, meta_model: nn.Module) -> InitialWeights | None:
    """The checked plan of `checkpoint.initial_hf` for the recipe's model on meta (module docstring);
    None without one, or when a resume from the run's own checkpoint is due (a [lora] run's checkpoints
    hold its adapters, not the frozen base: its base is loaded from here on a resume too). ConfigError
    for a folder that is not a checkpoint of this model."""
    if not cfg.checkpoint.initial_hf or (_resume_due(cfg) and not cfg.lora.enable):
        return None
    folder = Path(cfg.checkpoint.initial_hf)
    config = folder / "config.json"
    if not config.is_file():
        raise ConfigError(f"checkpoint.initial_hf {folder}: no config.json there (a Hugging Face model folder)")
    adapter = model_adapter(cfg.model)
    _same_architecture(cfg, adapter, read_hf_config(config), config)
    files = checkpoint_files(folder)
    try:
        checked = checked_mapping(folder, files, meta_model, adapter)
    except HeaderError as e:
        raise ConfigError(str(e)) from None
    if not checked.report.ok:
        raise ConfigError(refusal(folder, checked))
    direct, groups = _plan(checked)
    return InitialWeights(folder, checked, direct, groups)


def _same_architecture(cfg: JobConfig, adapter, hf_config: dict, path: Path) -> None:
    """A checkpoint whose config.json names another model_type than the recipe's model is refused."""
    got = hf_config.get("model_type")
    if cfg.model.hf_config:
        want = {read_hf_config(cfg.model.hf_config).get("model_type")}
    else:
        want = set(getattr(adapter, "hf_model_types", ()) or ())
    want.discard(None)
    if got and want and got not in want:
        raise ConfigError(
            f"{path}: model_type '{got}', but the recipe's model is {' / '.join(sorted(want))}: "
            "checkpoint.initial_hf must be a checkpoint of the model the recipe trains"
        )


def refusal(folder: Path, checked: CheckedCheckpoint) -> str:
    """One line: the first offending tensors, each with the file that holds it, and the counts."""
    report, headers = checked.report, checked.headers.tensors

    def where(hf: str) -> str:
        return headers[hf].file if hf in headers else folder.name

    lines = []
    for item in report.wrong_shape:
        hf = (item.get("hf") or ["?"])[0]
        lines.append(f"{where(hf)}: {hf} is {item['checkpoint']}, the model's {item['native']} is {item['model']}")
    for item in report.extra:
        hf = (item.get("hf") or ["?"])[0]
        lines.append(f"{where(hf)}: {hf} is extra ({item.get('why') or 'the model has no such tensor'})")
    for item in report.missing:
        names = ", ".join(item.get("hf") or []) or "its checkpoint name"
        lines.append(f"{folder}: no file holds {names} (the model's {item['native']})")
    for item in report.wrong_dtype:
        dtype = f"{item['dtype']}, the checkpoint's dtype is {item['expected']}"
        lines.append(f"{item['file']}: {item['hf'][0]} is {dtype}")
    lines += report.problems
    return (
        f"checkpoint.initial_hf {folder} does not fit the recipe's model: {'; '.join(lines[:SHOWN])}"
        f"{' ...' if len(lines) > SHOWN else ''} ({report.summary()})"
    )


def _plan(checked: CheckedCheckpoint) -> tuple[list[_Direct], list[_Group]]:
    """Which native tensors are read as boxes of one checkpoint tensor, which converted by group."""
    hf, native = checked.hf, checked.mapping.native
    by_id = {id(t): name for name, t in hf.items()}
    direct, pending = [], []
    for name, t in native.items():
        src = by_id.get(id(t)) or (by_id.get(id(t._base)) if t._base is not None else None)
        vm = view_map(t, hf[src]) if src is not None else None
        if vm is not None:
            direct.append(_Direct(name, src, vm))
        else:
            pending.append(name)
    if not pending:
        return direct, []
    prefixes = layer_groups(hf)
    owner: dict[str, str] = {}
    for prefix, names in prefixes.items():
        try:
            produced = checked.reader.from_hf({k: hf[k] for k in names})
        except Exception:  # an adapter that maps only the whole checkpoint: its tensors go in one group below
            continue
        for n in produced:
            owner.setdefault(n, prefix)
    groups: dict[str, _Group] = {}
    for name in pending:
        prefix = owner.get(name)
        key = "*" if prefix is None else prefix
        group = groups.setdefault(key, _Group(list(hf) if prefix is None else prefixes[prefix]))
        group.native.append(name)
    return direct, list(groups.values())


def weights_line(cfg: JobConfig, loaded: LoadStats | None, resumed_from: int | None) -> str:
    """Where the run's weights came from, for its log: its own checkpoint, the initial checkpoint, or ''."""
    if resumed_from is not None:
        line = f"resumed from step {resumed_from}"
        if loaded is not None:  # [lora]: the frozen base from initial_hf, what trains from the checkpoint
            line += f" on the frozen base of checkpoint.initial_hf ({loaded.line()})"
        elif cfg.checkpoint.initial_hf:
            why = "the run's own checkpoint takes precedence"
            line += f" (checkpoint.initial_hf {cfg.checkpoint.initial_hf} not loaded: {why})"
        return line
    if loaded is not None:
        return f"{loaded.line()}; this rank read {format_bytes(loaded.bytes_read)} in {loaded.seconds:.2f} s"
    return ""
