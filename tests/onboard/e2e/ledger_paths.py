"""Every file a ledger entry names exists: the evidence a person is pointed to is on disk.

A rung names its run folders, metrics files, rank logs, results and traces in its ledger entry
(details, measurements, the reproducing command), relative to the workspace (`runs/...`) or as
absolute paths inside it. Used by the climbs' tests (test_demo.py, the bf16 and port climbs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_TRIM = "()[]{}<>,;:'\"`"


def named_paths(ws: Path) -> list[tuple[str, str]]:
    """(where in the ledger, path text) of every workspace path the ledger's strings name."""
    ledger = json.loads((ws / "ladder.json").read_text())
    root = str(ws.resolve())
    found: list[tuple[str, str]] = []

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
                    found.append((where, token))

    for i, attempt in enumerate(ledger["attempts"]):
        walk(attempt, f"attempts[{i}]({attempt.get('rung')} #{attempt.get('attempt')})")
    return found


def assert_every_named_path_exists(ws: Path) -> int:
    """Fails naming each missing path and where the ledger names it; returns how many were checked."""
    found = named_paths(ws)
    missing = [f"{where}: {text}" for where, text in found if not (ws / text).exists()]
    assert not missing, f"{len(missing)} of {len(found)} paths the ledger names are missing:\n" + "\n".join(missing)
    assert found, "the ledger names no file at all"
    return len(found)
