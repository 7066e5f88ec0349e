"""One run per workspace: an advisory lock file holding the owner's pid.

The lock is an `fcntl.flock` on `.onboard.lock`, so the kernel releases it when the
owner dies however it dies; a lock file left behind by a dead process is simply taken
over. The pid written inside is for the message the second runner sees.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from onboard.errors import BadInput
from onboard.workspace.fsutil import pid_alive

LOCK_NAME = ".onboard.lock"


def _read_owner(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def holder(root: Path) -> int | None:
    """The pid named in the workspace's lock file when that process is alive, else None.

    Read-only (it never flocks), so `status` can say "running" without racing a next-step.
    """
    pid = _read_owner(Path(root) / LOCK_NAME).get("pid")
    return pid if isinstance(pid, int) and pid > 0 and pid_alive(pid) else None


class WorkspaceLock:
    """Context manager: `with WorkspaceLock(ws.root): ...`; BadInput when another live run holds it."""

    def __init__(self, root: Path, file_name: str = LOCK_NAME):
        """The lock of folder `root`; `file_name` names another lock file in it (new-model's
        per-name lock `onboarding/.NAME.lock`, held while a workspace is written or swapped)."""
        self.path = Path(root) / file_name
        self.fd: int | None = None
        self.took_over: dict | None = None
        """The previous owner's record when a dead run's lock file was taken over."""

    def acquire(self) -> "WorkspaceLock":
        if not self._take():
            pid = _read_owner(self.path).get("pid", "?")
            raise BadInput(
                f"another onboard run (pid {pid}) holds {self.path}; wait for it to finish (or stop it) and run again"
            )
        return self

    def try_acquire(self, wait_s: float = 0.0) -> bool:
        """Take the lock if it is free within `wait_s` seconds (polled); False if a live run keeps it."""
        deadline = time.monotonic() + wait_s
        while not self._take():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def follow(self, root: Path) -> None:
        """The locked folder was renamed to `root`: the lock file (the same inode, still
        locked) now lives there, which is where `release` must unlink it."""
        self.path = Path(root) / self.path.name

    def _take(self) -> bool:
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            # The holder we replaced may have unlinked the file between our open and our
            # flock; then we locked an orphan inode and must retry on the live path.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            previous = _read_owner(self.path)
            if previous.get("pid") and previous.get("pid") != os.getpid():
                self.took_over = previous  # its flock is gone, so its process is too
            record = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, record.encode(), 0)
                os.fsync(fd)
            except BaseException:  # a full disk: leave no lock file behind (we hold the flock, as release does)
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
                os.close(fd)
                raise
            self.fd = fd
            return True
        raise BadInput(f"could not take the lock {self.path}: it keeps changing under us")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # unlink while still holding the flock, then let it go
        except FileNotFoundError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "WorkspaceLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
