"""Every file a ledger entry names exists: the evidence a person is pointed to is on disk.

A rung names its run folders, metrics files, rank logs, results and traces in its ledger entry
(details, measurements, the reproducing command), relative to the workspace (`runs/...`) or as
absolute paths inside it. A per-rank name (titan_core's launcher writes `rank_<r>.log`) is a pattern:
at least one rank's file must exist. Used by the climbs' tests (test_demo.py, the bf16 and port climbs).
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path

_TRIM = "()[]{}<>,;:'\"`"
RANK = "<r>"  # the launcher's placeholder for a rank in a per-rank file name


def named_paths(ws: Path) -> list[tuple[str, str, str]]:
    """(where in the ledger, path text, the whole string) of every workspace path the ledger's strings name."""
    ledger = json.loads((ws / "ladder.json").read_text())
    root = str(ws.resolve())
    found: list[tuple[str, str, str]] = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str):
            for token in re.split(r"\s+", value):
                token = token.strip(_TRIM).rstrip(".")
                if "attempt-N" in token:  # a hint's placeholder, not a path
                    continue
                if token.startswith("runs/") or token.startswith(root + "/"):
                    found.append((where, token, value))

    for i, attempt in enumerate(ledger["attempts"]):
        walk(attempt, f"attempts[{i}]({attempt.get('rung')} #{attempt.get('attempt')})")
    return found


def exists(ws: Path, text: str) -> bool:
    """The file is there; for a per-rank name, some rank's file is."""
    path = str(ws / text)  # an absolute `text` stays itself
    return bool(glob.glob(path.replace(RANK, "*"))) if RANK in text else Path(path).exists()


def assert_every_named_path_exists(ws: Path) -> int:
    """Fails naming each missing path, where the ledger names it and the string it is in (a failure's
    report, say: what went wrong there); returns how many were checked."""
    found = named_paths(ws)
    missing = [f"{where}: {text}\n  in: {whole[:4000]}" for where, text, whole in found if not exists(ws, text)]
    assert not missing, f"{len(missing)} of {len(found)} paths the ledger names are missing:\n" + "\n".join(missing)
    assert found, "the ledger names no file at all"
    return len(found)
