"""An export folder's rules, the HF export's (training/hf_export.py) and the PEFT adapter's (lora/export.py)
alike: the mark its safetensors carry, which existing target an export may replace, and the publish.

An export is written into a dot-folder beside its target and published by one rename, so a partial export
never looks complete; an existing target is first renamed to a dated backup (runtime/files.py), never
deleted. `replace` says which target may be replaced: "own" (an earlier export of this trainer, told by
MARK, or an empty folder), "force" (anything), "never".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from titan_core.config.loader import ConfigError
from titan_core.runtime.files import backup_aside, default_mode
from titan_core.weights.st_headers import HeaderError, read_header

MARK = {"format": "pt", "exported_by": "titan_core"}
"""The safetensors metadata of every exported file: transformers reads "format"; "exported_by"
tells an earlier export (which replace="own" may replace) from a folder of someone else's."""
Replace = Literal["own", "force", "never"]


def marked(path: Path) -> bool:
    """Whether the safetensors file `path` carries MARK's `exported_by` (unreadable: no)."""
    try:
        return read_header(path).metadata.get("exported_by") == MARK["exported_by"]
    except (HeaderError, OSError):
        return False


def check_target(out: Path, replace: Replace, *, ours: Callable[[Path], bool], what: str, earlier: str) -> None:
    """ConfigError when `out` exists and `replace` does not allow replacing it; `ours(out)`: it holds an
    earlier export of this trainer; `what` and `earlier` name the export in the refusal."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise ConfigError(f"the export folder {out} exists and is not a folder")
    if replace == "force" or (replace == "own" and (ours(out) or not any(out.iterdir()))):
        return
    why = "it exists" if replace == "never" else f"it exists and holds no earlier {earlier} of this trainer"
    raise ConfigError(f"will not write {what} into {out}: {why}; choose another folder or move it away")


def publish(tmp: Path, out: Path) -> Path | None:
    """Give every file of the finished folder `tmp` a plain write's mode (safetensors writes 0600, and a
    shipped folder is read by others), then move it into place; an existing `out` is kept as a dated
    backup, whose path is returned."""
    for path in tmp.iterdir():
        os.chmod(path, default_mode())
    backup = backup_aside(out) if out.exists() or out.is_symlink() else None
    os.replace(tmp, out)
    return backup
