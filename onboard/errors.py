"""The ways a command ends early that are not gate results.

`BadInput` is the user's mistake (exit 2, one clear line, nothing written). `Interrupted`
is what the SIGTERM handler raises so a terminated rung unwinds like Ctrl-C does and the
attempt is recorded as interrupted instead of vanishing. An `OSError` reaching the CLI is
told apart by its errno (`describe_os_error`): a path, a name or a target that cannot be
written is the input's fault (exit 2); a disk that fills up or fails is the machine's
(exit 1). `EnvironmentFailed` is the machine failing after a run had started, with the
record of it on disk already said in its message (exit 1).
"""

from __future__ import annotations

import errno

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class BadInput(Exception):
    """Bad user input: the CLI prints the message on one line and exits 2."""


class Interrupted(BaseException):
    """Raised from the SIGTERM handler; a BaseException so `except Exception` lets it through."""


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
    return code, " ".join(line.splitlines())
