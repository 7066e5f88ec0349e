"""Start a child process that cannot outlive the process that started it.

A process killed with SIGKILL runs no cleanup: without this, a test child it started runs
on and writes results into a folder its parent already gave up on, and torchrun's ranks of a
local world (each in a session of its own) live on until their next collective times out.

`with_parent_death_signal(cmd)` returns an argv that runs `cmd` through this module: it asks
the kernel for SIGKILL when its parent dies (Linux `PR_SET_PDEATHSIG`, which survives the
`exec` into `cmd`), then checks that the parent is still the one that asked, because a
parent that died before the request was made would never send the signal. A child that must
clean up after itself asks for another signal: torchrun takes SIGTERM as its cue to stop its
ranks, which SIGKILL would leave running. Elsewhere
(macOS, Windows) there is no such request; the command is returned unchanged and a killed
parent can still leave children behind.

Why a wrapper and not `Popen(preexec_fn=...)`: a caller may start children while threads of
its own run, and code between fork and exec in a threaded parent may deadlock.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 129  # 128 + SIGHUP-like: the parent was gone before the child could start


def supported() -> bool:
    return sys.platform.startswith("linux")


def with_parent_death_signal(cmd: list[str], sig: signal.Signals = signal.SIGKILL) -> list[str]:
    """`cmd`, wrapped so that it gets `sig` when the calling process dies (unchanged off Linux)."""
    if not supported():
        return list(cmd)
    asked = [] if sig == signal.SIGKILL else [f"--signal={sig.name}"]
    return [sys.executable, "-m", "titan_core.runtime.die_with_parent", str(os.getpid()), *asked, "--", *cmd]


def _request_signal(sig: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


def main(argv: list[str]) -> int:
    sig, rest = signal.SIGKILL, argv[1:]
    if rest and rest[0].startswith("--signal="):
        sig, rest = signal.Signals.__members__.get(rest[0].split("=", 1)[1]), rest[1:]
    if len(rest) < 2 or rest[0] != "--" or not argv[0].isdigit() or sig is None:
        print("usage: python -m titan_core.runtime.die_with_parent PARENT_PID [--signal=SIGTERM] -- CMD [ARGS...]",
              file=sys.stderr)  # fmt: skip
        return 2
    parent, cmd = int(argv[0]), rest[1:]
    if not _request_signal(sig):
        print(f"error: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 2
    if os.getppid() != parent:
        return EXIT_PARENT_GONE
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"error: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
