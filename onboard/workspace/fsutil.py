"""File helpers the ledger and the scaffold rely on for crash safety."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

from titan_core.runtime.files import BACKUP_INFIX, backup_aside, fsync_dir  # noqa: F401  (one copy, shared with the trainer)

STALE_TMP_S = 30.0
"""A temp file of `atomic_write_text` this old is left by a writer that died: writing, fsyncing
and renaming a ledger-sized file takes milliseconds, so no live writer is still at it."""


def default_mode(kind: str = "file") -> int:
    """The permissions a plain open()/mkdir() would give under the current umask
    (mkstemp and mkdtemp create 0600/0700, which would hide workspace files from teammates)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if kind == "dir" else 0o666) & ~umask


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def remove_stale_temps(path: Path, *, now: float | None = None) -> list[Path]:
    """Remove the temp siblings `.NAME.[PID-]XXXX.tmp` that earlier writers of `path` left behind.

    A SIGKILL between mkstemp and the rename leaves one (the cleanup in `atomic_write_text`
    never runs). A temp is stale when the pid its name carries is not alive on this host,
    or when it is older than STALE_TMP_S (a temp from before names carried the pid, or a
    pid reused since). A live concurrent writer's temp is neither, so it is kept; the
    ledger's writers are serialised by the workspace lock anyway. Returns what it removed.
    """
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?:(\d+)-)?[^.]+\.tmp")
    now = time.time() if now is None else now
    removed = []
    try:
        candidates = list(os.scandir(path.parent))
    except OSError:
        return removed  # the write itself will say what is wrong with the folder
    for item in candidates:
        match = pattern.fullmatch(item.name)
        if match is None:
            continue
        try:
            if not item.is_file(follow_symlinks=False):
                continue
            pid = int(match.group(1)) if match.group(1) else None
            dead = pid is not None and pid != os.getpid() and not _pid_alive(pid)
            if dead or now - item.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
                os.unlink(item.path)
                removed.append(Path(item.path))
        except OSError:
            continue  # renamed by its writer meanwhile, or not ours to remove: tidying never fails a write
    return removed


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never half.

    The temp file lives in the same directory so `os.replace` is a same-filesystem rename;
    its name carries this process's pid, so the next writer can tell a killed writer's
    leftover from a live one's temp and remove it (`remove_stale_temps`).
    """
    path = Path(path)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else default_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        # also on KeyboardInterrupt: leave no temp file behind, the old file stays intact
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None and e.filename is None:
            # write() and fsync() name no file: a full disk's one-line message must say which
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
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
