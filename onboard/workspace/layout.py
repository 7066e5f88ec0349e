"""One model's workspace on disk: `<dir>/onboarding/<name>/` (DESIGN section 3)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from onboard.errors import BadInput
from onboard.workspace.fsutil import BACKUP_INFIX, backup_aside, fsync_dir, sha256_file
from onboard.workspace.ledger import Ledger, Status
from onboard.workspace.lock import WorkspaceLock
from titan_core.config import ConfigError
from titan_core.config.hf_config import read_hf_config
from titan_core.config.hf_keys import hf_key

WORKSPACES = "onboarding"
RECIPE = "recipe.toml"
HF_CONFIG = "config.json"
TWIN = "twin.json"
"""The twin the gates run on when the full model does not fit here (onboard/sizing/twin/derive.py)."""
LEDGER = "ladder.json"
REPORT = "REPORT.md"


MAX_NAME = 64
"""Longest NAME. The longest path component a workspace makes is new-model's temp folder
`.NAME.new-XXXXXXXX` (NAME plus 14 bytes), so any NAME allowed stays far below the 255
bytes per component that common filesystems allow."""


def validate_name(name: str) -> None:
    """A workspace name is a plain ASCII identifier of at most MAX_NAME characters: it
    becomes a folder and appears in commands."""
    if not name:
        raise BadInput("NAME is empty; use an identifier such as my_model")
    if len(name) > MAX_NAME:
        raise BadInput(f"NAME is {len(name)} characters long; at most {MAX_NAME} are allowed (it names a folder)")
    if "/" in name or "\\" in name or ".." in name:
        raise BadInput(f"NAME '{name}' must not contain '/', '\\' or '..'; it names a folder under {WORKSPACES}/")
    if not (name.isascii() and name.isidentifier()):
        raise BadInput(
            f"NAME '{name}' has characters other than letters, digits and '_' (or starts with a digit); "
            f"use e.g. '{_suggest(name)}'"
        )


def _suggest(name: str) -> str:
    cleaned = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_" for ch in name).strip("_")
    if not cleaned or cleaned[0].isdigit():
        cleaned = f"m_{cleaned}"
    return cleaned


def workspaces_dir(base: Path) -> Path:
    return Path(base) / WORKSPACES


@dataclass
class Workspace:
    """A workspace and its ledger. Architecture and device come from recipe.toml (the
    file a person edits); how the workspace was made comes from ladder.json."""

    root: Path
    name: str
    ledger: Ledger

    @classmethod
    def load(cls, base: Path, name: str) -> "Workspace":
        validate_name(name)
        root = workspaces_dir(base) / name
        recover(base, name)
        if not root.is_dir():
            known = ", ".join(w.name for w in list_workspaces(base)) or "none"
            raise BadInput(
                f"no workspace '{name}' under {workspaces_dir(base)} (workspaces: {known}); run `onboard new-model` first"
            )
        return cls(root=root.resolve(), name=name, ledger=Ledger.load(root / LEDGER))

    # ---- files ---------------------------------------------------------------------------
    @property
    def recipe_path(self) -> Path:
        return self.root / RECIPE

    @property
    def hf_config_path(self) -> Path | None:
        p = self.root / HF_CONFIG
        return p if p.is_file() else None

    @property
    def twin_path(self) -> Path | None:
        """twin.json when the recipe's [model] hf_config names it: the gates then run on the twin."""
        named = self._recipe_or_meta().get("model", {}).get("hf_config")
        p = self.root / TWIN
        return p if named and (self.root / str(named)).resolve() == p.resolve() and p.is_file() else None

    def model_label(self) -> str:
        """Which model the rungs run, for every ledger entry and the report: the twin (with its
        shape beside the full model's, read from the two files) or the full model."""
        twin = self.twin_path
        if twin is None:
            return "the full model"
        return f"twin of the full model: {TWIN} ({_shape(twin)}) for {HF_CONFIG} ({_shape(self.root / HF_CONFIG)})"

    @property
    def model_file(self) -> Path | None:
        """The ported model.py (port path only)."""
        p = self.root / "model.py"
        return p if p.is_file() else None

    @property
    def adapter_path(self) -> Path:
        return self.root / "adapter.py"

    @property
    def weights_dir(self) -> Path | None:
        w = self.ledger.meta.get("weights")
        return Path(w) if w else None

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    # ---- facts ---------------------------------------------------------------------------
    def recipe(self) -> dict:
        """recipe.toml as a dict; BadInput when a person's edit broke it."""
        if not self.recipe_path.is_file():
            raise BadInput(f"{self.recipe_path} is missing")
        try:
            return tomllib.loads(self.recipe_path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise BadInput(f"malformed TOML in {self.recipe_path}: {e}") from None

    def _recipe_or_meta(self) -> dict:
        # status and report must still work while a person's edit has broken recipe.toml;
        # the rungs load it strictly and report the error
        try:
            return self.recipe()
        except BadInput:
            return {}

    @property
    def family(self) -> str:
        return str(self._recipe_or_meta().get("model", {}).get("family", self.ledger.meta.get("family", "")))

    @property
    def device(self) -> str:
        return str(self._recipe_or_meta().get("device", {}).get("type", self.ledger.meta.get("device", "auto")))

    @property
    def path_kind(self) -> str:
        """'native' (a titan_core family runs it) or 'port' (the workspace's model.py does)."""
        return str(self.ledger.meta.get("path", "native"))

    # ---- hashing -------------------------------------------------------------------------
    def key_for(self, path: Path) -> str:
        """How a file is named in files_read: relative inside the workspace, absolute outside."""
        path = Path(path)
        if not path.is_absolute():
            path = self.root / path
        path = path.resolve()
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def path_for(self, key: str) -> Path:
        p = Path(key)
        return p if p.is_absolute() else self.root / p

    def weight_files(self) -> list[Path]:
        """The safetensors files of the workspace's weights folder (`--weights`), sorted; none without one."""
        w = self.weights_dir
        return sorted(w.glob("*.safetensors")) if w is not None and w.is_dir() else []

    def hashes(self, paths) -> dict[str, str | None]:
        """{files_read key: fingerprint} of the files a rung read (`fingerprint`)."""
        return {self.key_for(p): fingerprint(self.path_for(self.key_for(p))) for p in paths}

    def changed_files(self, files_read: dict[str, str | None], reads: Callable[[str], bool] | None = None) -> list[str]:
        """Keys whose current fingerprint differs from the recorded one (a deleted file counts).

        A difference that only the recipe edits of passed rungs made is no change for a rung
        that does not read the edited keys (`reads("section.field")` False: e.g. the eager
        rung runs eagerly whatever execution mode a later rung chose), so it keeps its
        evidence. An edit of a key it does read (a kernel the kernels rung kept, which the
        eager rung trains with) makes it re-verify, so passed is never shown for a recipe
        combination no gate ran. The recorded hash must lead to the current one through such
        edits alone; a hand edit anywhere in between breaks the chain and the file counts as
        changed. `reads` None: the rung reads every key.
        """
        chains = self.recipe_edit_chains(reads)
        changed = []
        for key, digest in files_read.items():
            current = fingerprint(self.path_for(key))
            if current != digest and not _chain_reaches(chains.get(key, {}), digest, current):
                changed.append(key)
        return changed

    def recipe_edit_chains(self, reads: Callable[[str], bool] | None = None) -> dict[str, dict[str, set[str]]]:
        """{file key: {sha256 before: {sha256 after, ...}}} of the edits recorded by passed attempts
        that touched no key `reads` says is read (None: every key is read, so no edit counts)."""
        chains: dict[str, dict[str, set[str]]] = {}
        for entry in self.ledger.attempts:
            edit = entry.get("recipe_edit")
            if entry.get("status") != Status.PASSED or not edit:
                continue
            keys = [e.get("key", "") for e in edit.get("edits") or []]
            if reads is None or not keys or any(reads(k) for k in keys):
                continue
            before, after = edit.get("sha256_before"), edit.get("sha256_after")
            if before and after:
                chains.setdefault(edit.get("file", RECIPE), {}).setdefault(before, set()).add(after)
        return chains


SHAPE_FIELDS = ("n_layers", "dim", "n_heads", "n_kv_heads", "vocab_size", "n_experts")
"""The sizes `_shape` shows, as native fields: each under the name the config itself uses (hf_keys)."""


def _shape(path: Path) -> str:
    """The size keys of an HF config file, e.g. "num_hidden_layers 2, hidden_size 256, ..."."""
    try:
        cfg = read_hf_config(path)
    except ConfigError as e:
        return f"unreadable: {e}"
    keys = (hf_key(f, cfg) for f in SHAPE_FIELDS)
    return ", ".join(f"{k} {cfg[k]}" for k in keys if k in cfg)


SAFETENSORS_HEADER_CAP = 100 * 2**20  # safetensors' own limit on a header's size
SAMPLES, SAMPLE_BYTES = 16, 64 * 2**10  # 1 MiB read of a weights file, however large


def fingerprint(path: Path) -> str | None:
    """What files_read records of a file: the hex sha256 of its bytes, or None when it is missing.

    A `*.safetensors` file (weights: gigabytes) is fingerprinted cheaply instead: the sha256
    of its size, its header (the 8-byte length and the JSON naming every tensor's dtype,
    shape and byte range) and 16 evenly spaced 64 KiB samples of the tensor bytes. Another
    architecture changes the header; other values of the same shapes (a fine-tuned
    checkpoint) change the samples; a few bytes edited between two samples go unseen, the
    price of not reading gigabytes.
    """
    path = Path(path)
    if path.suffix != ".safetensors" or not path.is_file():
        return sha256_file(path)
    size = path.stat().st_size
    h = hashlib.sha256(f"safetensors size={size}|".encode())
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        h.update(head + f.read(min(n, SAFETENSORS_HEADER_CAP)))
        start = f.tell()
        span = max(size - start, 0)
        for i in range(SAMPLES):
            f.seek(start + span * i // SAMPLES)
            h.update(f.read(min(SAMPLE_BYTES, span)))
    return h.hexdigest()


def _chain_reaches(edges: dict[str, set[str]], start: str | None, goal: str | None) -> bool:
    """Whether recorded edits lead from hash `start` to hash `goal` (a walk over before -> after)."""
    if start is None or goal is None:
        return False  # a file that was missing, or is missing now, was not edited by a rung
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen:  # an edit back and forth must not loop forever
                seen.add(nxt)
                todo.append(nxt)
    return False


def list_workspaces(base: Path) -> list[Path]:
    """Folders under <base>/onboarding/ that hold a ladder.json, sorted by name; hidden ones
    (new-model's temp folders `.NAME.new-*`, `.NAME.old-*`) and the workspaces `--force`
    replaced (`NAME.backup-*`) are never listed, and what a crashed new-model left is recovered first."""
    top = workspaces_dir(base)
    if not top.is_dir():
        return []
    for name in sorted({m.group(1) for p in top.iterdir() if (m := TEMP_FOLDER.fullmatch(p.name))}):
        recover(base, name)
    return sorted(
        p
        for p in top.iterdir()
        if not p.name.startswith(".") and BACKUP_INFIX not in p.name and p.is_dir() and (p / LEDGER).is_file()
    )


# ---- what a crashed new-model leaves behind --------------------------------------------------
# `new-model` builds a workspace in `.NAME.new-XXXX` (ladder.json written last: a temp folder
# holding one is complete) and renames it to NAME; `--force` first renames the old workspace
# to `.NAME.old-XXXX` and, once the new one is in place, that to `NAME.backup-<time>` (a
# replaced workspace is kept, never removed). All of it happens under the per-name lock
# `onboarding/.NAME.lock`. A crash at any instant leaves one of:
#   NAME (old) + incomplete or complete .new     -> the new one is removed (nothing was replaced)
#   no NAME    + .old (+ complete .new)          -> .old is renamed back: the command did not
#                                                   finish, so the workspace is as before it (its
#                                                   evidence and a porter's edits cannot be
#                                                   rebuilt; running the command again rebuilds the new)
#   no NAME    + complete .new, no .old          -> .new is moved in (a first new-model that had
#                                                   finished building: nothing to lose)
#   NAME (new) + .old                            -> .old becomes NAME.backup-<time> (the replacement
#                                                   was done; an .old an earlier onboard had partly
#                                                   removed is kept as it is too)
# The rename of the new one to NAME is the commit point. Recovery runs on the next
# Workspace.load, list_workspaces and new-model, under the same lock, so it never touches a
# folder a live new-model is still writing; it prints one line to stderr saying what it did.
TEMP_FOLDER = re.compile(rf"\.([A-Za-z_][A-Za-z0-9_]{{0,{MAX_NAME - 1}}})\.(new|old)-[A-Za-z0-9_]+")
RECOVER_WAIT_S = 10.0
"""How long a command waits for a live new-model of the same NAME that holds its lock while
NAME is missing (a swap in progress: renaming takes milliseconds, writing the files little more)."""


def temp_prefix(name: str, kind: str) -> str:
    """`.NAME.new-` or `.NAME.old-`: the prefix of new-model's temp folders (kind new | old)."""
    return f".{name}.{kind}-"


def name_lock(top: Path, name: str) -> WorkspaceLock:
    """The per-name lock in onboarding/ that new-model holds while it writes or swaps NAME."""
    return WorkspaceLock(top, f".{name}.lock")


def leftovers(top: Path, name: str) -> dict[str, list[Path]]:
    """{"new": [...], "old": [...]}: new-model's temp folders of NAME in `top`, oldest first."""
    found: dict[str, list[Path]] = {"new": [], "old": []}
    try:
        entries = list(os.scandir(top))
    except OSError:
        return found
    for entry in entries:
        m = TEMP_FOLDER.fullmatch(entry.name)
        if m and m.group(1) == name and entry.is_dir(follow_symlinks=False):
            found[m.group(2)].append(Path(entry.path))
    for paths in found.values():
        paths.sort(key=lambda p: (_mtime(p), p.name))
    return found


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0  # removed meanwhile by its own new-model: it sorts first and is skipped there


def recover(base: Path, name: str) -> str | None:
    """Finish or undo what a crashed new-model left of workspace NAME (see above).

    Takes the per-name lock: when a live new-model holds it, NAME is left to it (waiting up
    to RECOVER_WAIT_S when NAME is missing, so a swap in progress is waited out rather than
    reported as no workspace). Returns the line printed to stderr, None when nothing was done.
    """
    top = workspaces_dir(base)
    found = leftovers(top, name)
    if not found["new"] and not found["old"]:
        return None
    lock = name_lock(top, name)
    try:
        if not lock.try_acquire(0.0 if (top / name).is_dir() else RECOVER_WAIT_S):
            return None
        try:
            return recover_locked(top, name)
        finally:
            lock.release()
    except OSError as e:  # a read-only onboarding/ must not break status or list
        line = f"onboard: workspace {name}: could not tidy what an interrupted new-model left: {e}"
        print(line, file=sys.stderr)
        return line


def recover_locked(top: Path, name: str) -> str | None:
    """`recover` for a caller that holds the per-name lock (new-model itself)."""
    found = leftovers(top, name)
    root = top / name
    done: list[str] = []
    if not root.exists():
        complete = [p for p in found["new"] if (p / LEDGER).is_file()]
        if found["old"]:
            old = found["old"].pop()
            inner = old / name  # an earlier onboard kept the old workspace one level down
            src = inner if not (old / LEDGER).is_file() and (inner / LEDGER).is_file() else old
            # its lock file moved aside with it, left by the dead swapper: taken and released
            # (so removed) around the rename, so no next-step reports a lock taken over
            with WorkspaceLock(src) as ws_lock:
                os.rename(src, root)
                ws_lock.follow(root)
            if src == inner:
                os.rmdir(old)
            done.append("restored the workspace an interrupted `new-model --force` had moved aside")
        elif complete:
            new = complete[-1]
            found["new"].remove(new)
            os.rename(new, root)
            done.append("moved in the workspace an interrupted `new-model` had finished building")
        fsync_dir(top)
    stale = found["new"]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        done.append(f"removed {', '.join(p.name for p in stale)}")
    for path in found["old"]:  # a replaced workspace: kept, as the finished `--force` keeps it
        done.append(f"kept the workspace `new-model --force` replaced as {backup_aside(path, named_for=root).name}")
    if not done:
        return None
    line = f"onboard: workspace {name}: " + "; ".join(done)
    print(line, file=sys.stderr)
    return line
