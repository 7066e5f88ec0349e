"""Moving files into place without losing what was there: atomic writes, durable renames and dated backups.

A file written through `atomic_write_text` is the old one or the new one, never half of either,
whatever happens to the writer. The trainer's export and every command that replaces a person's
file or folder go through `backup_aside`, so "replace" never means "delete": the old one is renamed
beside the new one under a name that sorts by age and is never reused.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

BACKUP_INFIX = ".backup-"
"""What names a backup: `<name>.backup-<UTC time>[-N]` (`backup_aside`)."""


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


def backup_aside(path: Path, *, named_for: Path | None = None) -> Path:
    """Move `path` (a file or a folder) to `<name>.backup-YYYYmmddTHHMMSS` beside `named_for`
    (default: `path` itself) and return where it went; nothing is copied or deleted.

    The time is UTC, so backups sort by age; `-2`, `-3`, ... follow when that name is taken
    (two replacements in one second). `named_for` lets a caller that already moved the thing
    to a temp name back it up under the name a person knows. The destination is in the same
    folder, so the move is a rename: atomic, and as fast for a folder of checkpoints as for
    one file.
    """
    path = Path(path)
    named_for = Path(named_for) if named_for is not None else path
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    first = named_for.with_name(f"{named_for.name}{BACKUP_INFIX}{stamp}")
    dest, n = first, 2
    while dest.exists() or dest.is_symlink():
        dest, n = first.with_name(f"{first.name}-{n}"), n + 1
    os.rename(path, dest)
    fsync_dir(dest.parent)
    return dest


STALE_TMP_S = 30.0
"""A temp file of `atomic_write_text` this old is left by a writer that died: writing, fsyncing
and renaming a file of a few kilobytes takes milliseconds, so no live writer is still at it."""


def default_mode(kind: str = "file") -> int:
    """The permissions a plain open()/mkdir() would give under the current umask
    (mkstemp and mkdtemp create 0600/0700, which would hide the files from the rest of a team)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if kind == "dir" else 0o666) & ~umask


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's counts)."""
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
    writers of one file are serialised by their caller's own lock anyway. Returns what it removed.
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
            dead = pid is not None and pid != os.getpid() and not pid_alive(pid)
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
