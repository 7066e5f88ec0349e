"""File helpers the ledger and the scaffold rely on for crash safety."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename itself is still atomic
    finally:
        os.close(fd)


def default_mode(kind: str = "file") -> int:
    """The permissions a plain open()/mkdir() would give under the current umask
    (mkstemp and mkdtemp create 0600/0700, which would hide workspace files from teammates)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if kind == "dir" else 0o666) & ~umask


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader (or a crash) sees the old file or the new one, never half.

    The temp file lives in the same directory so `os.replace` is a same-filesystem rename.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else default_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # also on KeyboardInterrupt: leave no temp file behind, the old file stays intact
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


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
