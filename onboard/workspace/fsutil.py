"""File helpers the ledger and the scaffold rely on for crash safety: titan_core's (one copy, shared with
the trainer), and the fingerprint of a file's bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from titan_core.runtime.files import (  # noqa: F401  (re-exported: one copy, shared with the trainer)
    BACKUP_INFIX, STALE_TMP_S, atomic_write_bytes, atomic_write_text, backup_aside, default_mode, fsync_dir, pid_alive,
    remove_stale_temps,
)  # fmt: skip


def sha256_file(path: Path) -> str | None:
    """Hex sha256 of a file's bytes, or None when it does not exist (counts as changed)."""
    path = Path(path)
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
