"""The ONBOARD_* environment variables: what each one is for, the one reading of them a command makes,
and the environment a child process gets.

There are two, both read by a workspace's test_parity.py (onboard/parity/results.py names them):

- ONBOARD_PARITY_RESULTS, plumbing: where the test writes its results. The parity rung sets it to
  its attempt folder for the child it starts; run by hand, the test writes to runs/parity/.
- ONBOARD_PARITY_WEIGHTS, a person's override for a by-hand run of the test: another weights folder
  than the one new-model recorded. The results.json such a run writes records it
  (`environment.overrides`).

A gate runs what the workspace records, never what a shell happens to hold: a command reads the
ONBOARD_* variables once, when it starts (`command_scope`, entered by the CLI's `run_command`), its
children get an environment without any inherited ONBOARD_* (`child_env`) plus the ones the command
sets itself, and the parity attempt's evidence names what it passed and what it left out
(details.environment: {passed, ignored}). So a value left in a shell from a by-hand run is on the
record and steers nothing.
"""

from __future__ import annotations

import contextvars
import os
from contextlib import contextmanager
from typing import Iterator, Mapping

PREFIX = "ONBOARD_"

_AT_START: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("onboard_env", default=None)


def _read(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(PREFIX)}


@contextmanager
def command_scope() -> Iterator[dict[str, str]]:
    """One command: the ONBOARD_* variables as they were when it started, for everything it runs."""
    token = _AT_START.set(_read(os.environ))
    try:
        yield dict(_AT_START.get() or {})
    finally:
        _AT_START.reset(token)


def inherited() -> dict[str, str]:
    """The ONBOARD_* variables this command started with ({name: value}); outside a command (a
    test, a by-hand pytest run), the process's environment now."""
    at_start = _AT_START.get()
    return dict(at_start) if at_start is not None else _read(os.environ)


def child_env(passed: Mapping[str, str], **extra: str) -> dict[str, str]:
    """The environment for a child process: this one's, less every ONBOARD_* variable, plus `passed`
    (the ONBOARD_* variables the command means the child to read) and `extra` (other settings)."""
    unknown = [k for k in passed if not k.startswith(PREFIX)]
    if unknown:
        raise ValueError(f"child_env: {unknown} are not {PREFIX}* variables; pass them as extra")
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    return {**env, **extra, **passed}
