"""The two ways a command ends early that are not gate results.

`BadInput` is the user's mistake (exit 2, one clear line, nothing written). `Interrupted`
is what the SIGTERM handler raises so a terminated rung unwinds like Ctrl-C does and the
attempt is recorded as interrupted instead of vanishing.
"""

from __future__ import annotations

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class BadInput(Exception):
    """Bad user input: the CLI prints the message on one line and exits 2."""


class Interrupted(BaseException):
    """Raised from the SIGTERM handler; a BaseException so `except Exception` lets it through."""
