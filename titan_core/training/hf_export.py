"""HF export in the `save_pretrained` layout, gathered one tensor at a time and published atomically.

`export_hf(model, family, args, out_dir)` writes `config.json` (`_export_config`), the weights as
`model.safetensors`, or as `model-0000k-of-0000n.safetensors` shards of at most `shard_mb` MB
(10^6 bytes, as transformers counts) with `model.safetensors.index.json` (metadata.total_size,
weight_map), and the tokenizer files it is given.

The weights come from the model's HF weight stream (titan_core/weights/hf_stream.py): the adapter's
`to_hf` on meta first (a model it cannot map is refused before any collective), then one gathered
tensor at a time (one layer group's for a concatenation), every rank joining the gathers and rank 0
alone given the tensors, so its peak host memory is about one shard plus one layer group, never the
whole model.

Everything is written into a dot-folder beside the target and renamed into place at the end, so
a partial export never looks complete; an existing target is first renamed to a dated backup
beside it (`<target>.backup-<UTC time>`, titan_core/runtime/files.py), never deleted. Every file
gets the mode a plain write gives (safetensors writes 0600), and a write that fails for want of
space (safetensors says so in a SafetensorError) is an OSError naming the target, nothing left.
Which existing target may be replaced is `replace`'s choice: "own" (the trainer's: only an
earlier export of this module, which marks its safetensors with `exported_by`, or an empty
folder), "force" (anything), "never" (the rules and the publish: weights/export_folder.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from titan_core.config.hf_config import read_hf_config
from titan_core.config.loader import ConfigError
from titan_core.config.sections import Data
from titan_core.config.sections import Model as ModelConfig
from titan_core.models.common.hf_adapter import AdapterError
from titan_core.models.registry import get_family
from titan_core.models.model_builder import args_from_hf_config, model_adapter
from titan_core.weights.header_check import INDEX, SINGLE
from titan_core.runtime.distributed import group_rank
from titan_core.weights.hf_stream import StreamPlan, stream_plan
from titan_core.weights.export_folder import MARK, Replace, check_target, marked, publish

MB = 10**6
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""Copied from beside the tokenizer.json, where present."""


def _on() -> bool:
    return dist.is_available() and dist.is_initialized()


def tokenizer_files(data: Data) -> list[tuple[Path, str]]:
    """(source, name in the export) of the run's own tokenizer (data.tokenizer = "hf"): its
    tokenizer.json and the config files beside it; [] for another tokenizer (byte, bpe: no HF
    tokenizer to ship). ConfigError when the hf tokenizer is not there: an export without it
    would not load in AutoTokenizer."""
    if data.tokenizer != "hf":
        return []
    return hf_tokenizer_files(data.tokenizer_path, what="data.tokenizer_path")


def hf_tokenizer_files(path: str | Path, *, what: str) -> list[tuple[Path, str]]:
    """(source, name in the export) of the tokenizer.json `path` names (or the folder holding one)
    and the TOKENIZER_FILES beside it; ConfigError naming `what` when there is none."""
    if not str(path):
        raise ConfigError(f"{what} is empty: it names the run's tokenizer.json, or a folder holding one")
    path = Path(path).expanduser()
    if path.is_dir():
        main = path / "tokenizer.json"
        if not main.is_file():
            raise ConfigError(f"the tokenizer is missing: {path} ({what}) holds no tokenizer.json")
    elif path.is_file():
        main = path
    else:
        raise ConfigError(f"the tokenizer is missing: {path} ({what}) does not exist")
    folder = main.parent
    return [(main, "tokenizer.json")] + [(folder / n, n) for n in TOKENIZER_FILES if (folder / n).is_file()]


def is_export(folder: Path) -> bool:
    """Whether `folder` holds an export written here (its weights carry MARK's `exported_by`)."""
    try:
        if (folder / SINGLE).is_file():
            first = folder / SINGLE
        else:
            weight_map = json.loads((folder / INDEX).read_text(encoding="utf-8"))["weight_map"]
            first = folder / sorted(set(weight_map.values()))[0]
        return marked(first)
    except Exception:  # unreadable or not a checkpoint: not ours
        return False


def check_export_target(out: Path, replace: Replace = "own") -> None:
    """ConfigError when `out` exists and `replace` does not allow replacing it (module docstring)."""
    check_target(out, replace, ours=is_export, what="the export", earlier="export")


def export_hf(
    model: nn.Module,
    family_name: str,
    args,
    out_dir: str | Path,
    *,
    model_cfg: ModelConfig | None = None,
    shard_mb: int = 5000,
    tokenizer: list[tuple[Path, str]] = (),
    replace: Replace = "own",
    plan: Callable[[nn.Module, Any], StreamPlan] = stream_plan,
) -> Path:
    """Export `model` into `out_dir` (module docstring); returns `out_dir`. Collective under a process group.
    `plan(model, adapter)` gives the weight stream written: the model's own by default (a LoRA run's
    merged export passes the stream of the merged model, titan_core/lora/stream.py).

    With `model_cfg` (the recipe's [model] section) the export goes through the recipe's
    model: its adapter (`adapter_file`'s, else the family's) maps the weights, and config.json
    is the recipe's `hf_config` with every field kept (model_type, architectures, a port's
    own keys), [model.overrides] written into it, dtype that of the exported tensors; a recipe
    without `hf_config`, or whose adapter says `exports_whole_config` (the transformers path:
    its `hf_config(args)` is that config.json with the overrides in, under any key), gets the
    adapter's `hf_config(args)`. Without `model_cfg`: the family's.
    """
    try:
        from safetensors.torch import save_file  # noqa: F401  # lazy: the [hf] extra, refused before any collective
    except ImportError:
        raise ConfigError("exporting HF weights needs safetensors: pip install titan-onboard[hf]") from None
    adapter = model_adapter(model_cfg) if model_cfg is not None else get_family(family_name).adapter
    out = Path(out_dir)
    check_export_target(out, replace)
    try:  # every rank: pure functions, so a refusal is every rank's before any collective
        weights = plan(model, adapter)
        config = _export_config(adapter, model_cfg, args)
    except AdapterError as e:
        raise ConfigError(f"cannot export HF weights: {e}") from None
    tmp = out.with_name(f".{out.name}.partial")
    writer = _ShardWriter(tmp, shard_mb * MB) if group_rank() == 0 else None
    failure: Exception | None = None
    if writer is not None:  # debris of an earlier interrupted export goes first
        failure = _attempt(lambda: (shutil.rmtree(tmp, ignore_errors=True), tmp.mkdir(parents=True)))
    try:
        # every rank drives the stream (its gathers are collectives); rank 0 alone is given the tensors
        for name, tensor in weights.weights(dst=0, device="cpu"):
            if failure is None:
                failure = _attempt(lambda: writer.add(name, tensor))
            del tensor
        if writer is not None and failure is None:
            failure = _attempt(lambda: _finish(writer, config, tokenizer, tmp, out))
    finally:
        if writer is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # not published: nothing partial is left behind
    _agree(_said_of(failure, tmp, out))
    return out


_OS_ERROR = re.compile(r"\(os error (\d+)\)")
"""How safetensors' SafetensorError carries the OS's error: "... No space left on device (os error 28)"."""


def _said_of(failure: Exception | None, tmp: Path, out: Path) -> Exception | None:
    """An OS failure while writing as an OSError naming the export's target (the temp folder it
    happened in is gone by now): safetensors' SafetensorError wraps one in its message, and write()
    names no file at all. Anything else as it was."""
    if isinstance(failure, OSError):
        where = failure.filename
        named = isinstance(where, (str, os.PathLike)) and not Path(where).is_relative_to(tmp)
        if named or failure.errno is None:
            return failure
        code = failure.errno
    # by name: the class lives in safetensors' compiled module, an optional extra
    elif type(failure).__name__ == "SafetensorError" and (m := _OS_ERROR.search(str(failure))):
        code = int(m.group(1))
    else:
        return failure
    said = OSError(code, os.strerror(code), str(out))
    said.__cause__ = failure
    return said


def _attempt(fn) -> Exception | None:
    """Run rank 0's writing step; its error, kept so every rank still joins the gathers that follow."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- reported to every rank by _agree
        return e
    return None


def _agree(failure: Exception | None) -> None:
    """Raise rank 0's export error on every rank (the others raise what it was, in words)."""
    if not _on():
        if failure is not None:
            raise failure
        return
    box = [None if failure is None else (isinstance(failure, ConfigError), f"{type(failure).__name__}: {failure}")]
    dist.broadcast_object_list(box, src=0)
    if failure is not None:
        raise failure
    if box[0] is not None:
        config_error, what = box[0]
        raise (ConfigError if config_error else RuntimeError)(f"rank 0 could not write the export: {what}")


def _finish(writer: _ShardWriter, config: dict, tokenizer, tmp: Path, out: Path) -> None:
    writer.finish()
    config = dict(config)
    config.pop("torch_dtype", None)  # transformers 4's name for dtype; the export says its own
    if len(writer.dtypes) == 1:
        config["dtype"] = str(next(iter(writer.dtypes))).removeprefix("torch.")
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for src, name in tokenizer:
        shutil.copyfile(src, tmp / name)
    publish(tmp, out)


class _ShardWriter:
    """Tensors into safetensors files of at most `limit` bytes each (a bigger tensor gets its own)."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = folder, limit
        self.current: dict[str, torch.Tensor] = {}
        self.size = 0
        self.written: list[tuple[Path, list[str]]] = []
        self.total = 0
        self.dtypes: set[torch.dtype] = set()

    def add(self, name: str, t: torch.Tensor) -> None:
        n = t.numel() * t.element_size()
        if self.current and self.size + n > self.limit:
            self._flush()
        self.current[name] = t
        self.size += n
        self.total += n
        self.dtypes.add(t.dtype)

    def _flush(self) -> None:
        from safetensors.torch import save_file  # lazy: the [hf] extra (checked by export_hf)

        path = self.folder / f".shard-{len(self.written) + 1}.safetensors"
        save_file(self.current, str(path), metadata=MARK)
        self.written.append((path, list(self.current)))
        self.current, self.size = {}, 0

    def finish(self) -> None:
        """Name the files as save_pretrained does, and write the index when there are several."""
        if self.current or not self.written:
            self._flush()
        n = len(self.written)
        weight_map = {}
        for k, (path, names) in enumerate(self.written, start=1):
            final = SINGLE if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"
            os.replace(path, self.folder / final)
            weight_map.update({name: final for name in names})
        if n > 1:
            index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
            (self.folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _export_config(adapter, model_cfg: ModelConfig | None, args) -> dict[str, Any]:
    """The HF config of an export (see `export_hf`). A recipe's [model.overrides] are written
    through the adapter's `hf_config(args)` into the keys config.json already has; the result
    must read back as the trained args, else the export would describe another model."""
    if model_cfg is None or not model_cfg.hf_config:
        if not callable(getattr(adapter, "hf_config", None)):
            raise ConfigError("the adapter has no hf_config(args) and the recipe names no model.hf_config to export")
        return adapter.hf_config(args)
    if getattr(adapter, "exports_whole_config", False):
        return adapter.hf_config(args)  # the recipe's config.json itself, its overrides written in
    config = read_hf_config(model_cfg.hf_config)
    if not model_cfg.overrides:
        return config  # the trained args are this config's, by construction
    try:
        mapped = adapter.hf_config(args) if callable(getattr(adapter, "hf_config", None)) else {}
    except AdapterError:
        mapped = {}  # a port's family may not export its shape; the read-back check below decides
    config.update({k: v for k, v in mapped.items() if k in config and k not in ("model_type", "architectures")})
    if dc_replace(args_from_hf_config(adapter, config), init_std=args.init_std) != args:  # init is no architecture
        raise ConfigError(
            f"cannot export HF weights: the recipe's [model.overrides] {sorted(model_cfg.overrides)} change the "
            f"architecture in a way {model_cfg.hf_config} cannot be rewritten to say; export without them"
        )
    return config
