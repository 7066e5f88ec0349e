"""Processes as the tests that stop them see them, read from /proc (Linux): a process's state, whether
it still runs, and which processes run a given command line. Imported by tests (tests/ is on the
path: its conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path


def state(pid: int) -> str | None:
    """The process's state letter (R, S, T for stopped, Z for a zombie: it has exited); None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0]
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie that has exited."""
    return state(pid) not in (None, "Z")


def pids_running(needle: str) -> list[int]:
    """Live processes (not this one) whose command line contains `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmdline and alive(int(entry.name)):
                found.append(int(entry.name))
    return found
