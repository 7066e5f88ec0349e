"""The ways a command ends early that are not gate results.

`BadInput` is the user's mistake (exit 2, one clear line, nothing written). `Interrupted`
is what the SIGTERM handler (`signals_raise`) raises so a terminated command unwinds like
Ctrl-C does: its temp folders are removed, its child processes stopped, and an attempt is
recorded as interrupted instead of vanishing; the exit code is 128 + the signal's number
(130 for SIGINT, 143 for SIGTERM), as a shell reports it. An `OSError` reaching the CLI is
told apart by its errno (`describe_os_error`): a path, a name or a target that cannot be
written is the input's fault (exit 2); a disk that fills up or fails is the machine's
(exit 1). `EnvironmentFailed` is the machine failing after a run had started, with the
record of it on disk already said in its message (exit 1).
"""

from __future__ import annotations

import errno
import shutil
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
"""SIGINT (Ctrl-C): 128 + 2."""


class BadInput(Exception):
    """Bad user input: the CLI prints the message on one line and exits 2."""


class Interrupted(BaseException):
    """Raised from the SIGTERM handler (`signals_raise`); a BaseException so `except Exception`
    lets it through. `signum` is the signal that stopped the command."""

    def __init__(self, signum: int = signal.SIGTERM):
        self.signum = int(signum)
        super().__init__(signal_name(self.signum))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def interrupt_signal(e: BaseException) -> int:
    """The signal behind an interrupt: Interrupted's own, SIGINT for a KeyboardInterrupt."""
    return e.signum if isinstance(e, Interrupted) else int(signal.SIGINT)


def interrupted_exit_code(signum: int) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)


@contextmanager
def signals_raise() -> Iterator[list[int]]:
    """While inside (main thread only): SIGTERM raises Interrupted as Ctrl-C raises KeyboardInterrupt,
    and each of the two received is appended to the yielded list. Code that takes the exception for a
    failure of its own (a child process the same Ctrl-C stopped, a library that catches it) then
    cannot hide that the command was interrupted: the list says so. A signal the process ignores
    (a background job's SIGINT) stays ignored, and a SIGINT handler someone else installed is kept."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_term(signum, frame):
        received.append(signum)
        raise Interrupted(signum)

    def on_int(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt

    on_term.notes_interrupts = on_int.notes_interrupts = True  # a nested signals_raise may take over
    previous = {}
    for sig, handler in ((signal.SIGTERM, on_term), (signal.SIGINT, on_int)):
        current = signal.getsignal(sig)
        ours = current is signal.default_int_handler or getattr(current, "notes_interrupts", False)
        if current is signal.SIG_IGN or current is None or (sig == signal.SIGINT and not ours):
            continue
        previous[sig] = signal.signal(sig, handler)
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class EnvironmentFailed(Exception):
    """The machine failed mid-run (disk full, I/O error): the CLI prints the message on one line and exits 1."""


# errno -> what the person can do about it. These are the input's fault: the path, the name
# or the target folder given cannot be used as it is (exit 2).
INPUT_ERRNOS = {
    errno.ENAMETOOLONG: "a name in that path is longer than the filesystem allows; use a shorter NAME or --dir",
    errno.ENOTDIR: "a part of that path is a file, not a folder; check --dir",
    errno.EISDIR: "that is a folder where a file is expected",
    errno.EEXIST: "a file is in the way where a folder is needed",
    errno.ENOENT: "it does not exist",
    errno.ELOOP: "it is a loop of symbolic links",
    errno.EACCES: "permission denied; run as a user who may write there, or use another --dir",
    errno.EPERM: "operation not permitted; run as a user who may write there, or use another --dir",
    errno.EROFS: "the filesystem is read-only; work in a writable copy or use another --dir",
}
# These are the machine's: nothing about the input changes them (exit 1); any other errno too.
ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "the disk is full; free space and run again",
    errno.EDQUOT: "the disk quota is used up; free space and run again",
    errno.EIO: "the disk reported an I/O error",
}


def describe_os_error(e: OSError) -> tuple[int, str]:
    """(exit code, one line) for an OSError: the path(s), the system's words, the errno's
    name and what to do, e.g. `/w/.onboard.lock: Read-only file system (EROFS); the ...`."""
    code = EXIT_BAD_INPUT if e.errno in INPUT_ERRNOS else EXIT_FAILED
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    what = e.strerror or str(e) or type(e).__name__
    name = errno.errorcode.get(e.errno) if e.errno is not None else None
    advice = INPUT_ERRNOS.get(e.errno) or ENVIRONMENT_ERRNOS.get(e.errno)
    line = (" -> ".join(paths) + ": " if paths else "") + what + (f" ({name})" if name else "")
    line += f"; {advice}" if advice else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT) and paths:
        line += free_space(paths[0])
    return code, " ".join(line.splitlines())


def free_space(path: str) -> str:
    """`" (N free on the filesystem of P)"` for the nearest folder of `path` that exists (the
    file itself may be the half-made one that failed), or "" when none can be read."""
    from titan_core.memory.estimate import format_bytes  # lazy: only a full disk needs it

    folder = Path(path).absolute()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return f" ({format_bytes(free)} free on the filesystem of {folder})"
