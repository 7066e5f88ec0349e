"""One model's workspace on disk: `<dir>/onboarding/<name>/` (DESIGN section 3)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

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

    def hashes(self, paths) -> dict[str, str | None]:
        return {self.key_for(p): sha256_file(self.path_for(self.key_for(p))) for p in paths}

    def changed_files(self, files_read: dict[str, str | None]) -> list[str]:
        """Keys whose current sha256 differs from the recorded one (a deleted file counts).

        A difference that only the recipe edits of passed rungs made is no change: those
        edits were proven by their own gate (e.g. the kernels gate showed the kernel equal to
        the plain path), so the rungs before them keep their evidence. The recorded hash
        must lead to the current one through recorded edits alone; a hand edit anywhere in
        between breaks the chain and the file counts as changed.
        """
        chains = self.recipe_edit_chains()
        changed = []
        for key, digest in files_read.items():
            current = sha256_file(self.path_for(key))
            if current != digest and not _chain_reaches(chains.get(key, {}), digest, current):
                changed.append(key)
        return changed

    def recipe_edit_chains(self) -> dict[str, dict[str, set[str]]]:
        """{file key: {sha256 before: {sha256 after, ...}}} of the edits recorded by passed attempts."""
        chains: dict[str, dict[str, set[str]]] = {}
        for entry in self.ledger.attempts:
            edit = entry.get("recipe_edit")
            if entry.get("status") != "passed" or not edit:
                continue
            before, after = edit.get("sha256_before"), edit.get("sha256_after")
            if before and after:
                chains.setdefault(edit.get("file", RECIPE), {}).setdefault(before, set()).add(after)
        return chains


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
