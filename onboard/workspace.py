"""One model's workspace on disk: `<dir>/onboarding/<name>/` (DESIGN section 3)."""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from onboard.errors import BadInput
from onboard.fsutil import sha256_file
from onboard.ledger import Ledger

WORKSPACES = "onboarding"
RECIPE = "recipe.toml"
HF_CONFIG = "config.json"
LEDGER = "ladder.json"
REPORT = "REPORT.md"


def validate_name(name: str) -> None:
    """A workspace name is a plain ASCII identifier: it becomes a folder and appears in commands."""
    if not name:
        raise BadInput("NAME is empty; use an identifier such as my_model")
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
            if entry.get("status") != "passed" or not edit:
                continue
            keys = [e.get("key", "") for e in edit.get("edits") or []]
            if reads is None or not keys or any(reads(k) for k in keys):
                continue
            before, after = edit.get("sha256_before"), edit.get("sha256_after")
            if before and after:
                chains.setdefault(edit.get("file", RECIPE), {}).setdefault(before, set()).add(after)
        return chains


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
    """Folders under <base>/onboarding/ that hold a ladder.json, sorted by name."""
    top = workspaces_dir(base)
    if not top.is_dir():
        return []
    return sorted(p for p in top.iterdir() if p.is_dir() and (p / LEDGER).is_file())
