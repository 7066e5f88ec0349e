"""Moving files into place without losing what was there: durable renames and dated backups.

The trainer's export and every onboard command that replaces a person's file or folder go
through `backup_aside`, so "replace" never means "delete": the old one is renamed beside the
new one under a name that sorts by age and is never reused.
"""

from __future__ import annotations

import os
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
