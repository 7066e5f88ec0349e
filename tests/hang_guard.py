"""Hang guards for the tests' subprocesses that scale with the machine's load.

A guard's base is what the work takes on an idle machine with room to spare; a loaded one runs
the same work slower (the demo: 1,669 s at load 8 on 2 cores against a 600 s guard), so the
timeout is base x (load per core), at least the base and at most CAP times it. A guard that
fires says the load at start and at end, so a reader tells a loaded machine from a hang.
Imported by tests (tests/ is on the path: its conftest.py); never by a subprocess worker.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

CAP = 4.0
"""The most a guard stretches: past 4x its base on a 4x overloaded machine, a run is more likely hung than slow."""


@dataclass(frozen=True)
class Load:
    average: float
    """The larger of the 1- and 5-minute load averages: the 1-minute figure lags a load that just
    began, the 5-minute one a load that just ended; a run of minutes sees both."""
    cores: int
    """CPUs this process may run on."""

    @classmethod
    def now(cls) -> "Load":
        try:
            one, five, _ = os.getloadavg()
        except (OSError, AttributeError):  # no load average on this OS: an unloaded machine
            one = five = 0.0
        return cls(max(one, five), _cores())

    def describe(self) -> str:
        return f"load average {self.average:.1f} on {self.cores} cores"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def stretch(load: Load, cap: float = CAP) -> float:
    """How much longer than on an idle machine: load per core, between 1 and `cap`."""
    return min(cap, max(1.0, load.average / max(1, load.cores)))


@dataclass
class HangGuard:
    what: str
    """What runs under the guard, as the failure names it (a command, a worker and its ranks)."""
    base_s: float
    """The timeout on an idle machine."""
    start: Load = field(default_factory=Load.now)
    """The load when the guarded work began: the timeout is fixed from it."""

    @property
    def timeout_s(self) -> float:
        return self.base_s * stretch(self.start)

    def message(self, end: Load | None = None) -> str:
        end = end or Load.now()
        return (
            f"{self.what}: no result within {self.timeout_s:.0f} s (hang guard {self.base_s:.0f} s x "
            f"{stretch(self.start):.2f} for the load); {self.start.describe()} at start, {end.describe()} at end"
            f"{' (a loaded machine: slow, perhaps not hung)' if max(stretch(self.start), stretch(end)) > 1 else ''}"
        )

    def fail(self, detail: str = "") -> None:
        pytest.fail(self.message() + (f"\n{detail}" if detail else ""))

    def fail_if(self, fired: bool, detail: str = "") -> None:
        """For a guard enforced elsewhere (the launcher's timeout_s): fail with the load when it fired."""
        if fired:
            self.fail(detail)


@contextmanager
def hang_guard(base_s: float, what: str) -> Iterator[HangGuard]:
    """`with hang_guard(300, "onboard demo") as guard: subprocess.run(..., timeout=guard.timeout_s)`:
    a subprocess.TimeoutExpired inside becomes a test failure that states the load."""
    guard = HangGuard(what, base_s)
    try:
        yield guard
    except subprocess.TimeoutExpired as e:
        tail = e.stderr or e.output or b""
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        guard.fail(f"last output:\n{tail[-2000:]}" if tail else "")


def guarded_launch(cmd: list[str], nproc: int, base_s: float, what: str, **kwargs):
    """titan_core's launch_command with the launcher's timeout as a scaled hang guard: a world that
    outlives it fails the test with the load; any other result comes back for the test to judge."""
    from titan_core.launcher import EXIT_TIMEOUT, launch_command  # lazy: torch-free until a test launches

    guard = HangGuard(what, base_s)
    result = launch_command(cmd, nproc, timeout_s=guard.timeout_s, **kwargs)
    guard.fail_if(result.exit_code == EXIT_TIMEOUT, result.failure or "")
    return result
