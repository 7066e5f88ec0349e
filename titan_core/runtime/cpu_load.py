"""How much of the machine other processes held while a comparison ran.

A paired timing ratio assumes both sides saw the same machine. When another process holds a
core for part of the rounds, one side's steps lose it more than the other's and the ratio moves
for a reason that has nothing to do with the candidate. So the timing protocol snapshots the
machine before and after a comparison (`snapshot`) and asks how many cores' worth of CPU other
processes used meanwhile (`foreign_cores`):

    foreign = (busy CPU seconds of our cores - this process's own CPU seconds) / wall seconds

- busy seconds come from /proc/stat (total - idle - iowait, in USER_HZ ticks), summed over the
  cores this process may run on (its affinity): a busy core we cannot run on does not slow us;
- own seconds are this process's (all its threads), its reaped children's (getrusage) and its
  live descendants' (/proc/<pid>/stat): a pool of compile workers the comparison started is this
  comparison's own work, not another job;
- the 1-minute load average is kept too (the protocol judges its change, `load_rise_own_bound`
  says how much of a rise this process's own threads can explain).

Where /proc/stat is missing (macOS) busy seconds are None and nothing is judged by them. Light
on purpose: only the standard library.
"""

from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

RESOLUTION_CORES = 0.1
"""The largest error the counters' tick rounding may put into `foreign_cores` for it to be judged:
/proc/stat counts each core's busy time in whole ticks, so a window must last about
2 x cores / (USER_HZ x this) seconds (0.4 s for 2 cores, 3.2 s for 16) before its figure is one."""

LOADAVG_PERIOD_S = 5.0
"""The kernel updates the load averages every 5 s (the 1-minute one by a factor exp(-5/60))."""


@dataclass(frozen=True)
class LoadSnapshot:
    """The machine's CPU counters at one moment, as `foreign_cores` compares two of them."""

    wall_s: float
    """A monotonic clock, seconds."""
    busy_s: float | None
    """CPU seconds the counted cores have spent busy since boot (None: no /proc/stat to read)."""
    cores: int
    """How many cores `busy_s` sums over (the ones this process may run on)."""
    tick_s: float
    """The resolution of `busy_s`: one USER_HZ tick, seconds."""
    own_s: float
    """CPU seconds of this process, its reaped children and its live descendants."""
    load_1m: float | None
    """The 1-minute load average (None where the OS has none)."""


def _ticks_per_s() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


def _cores() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def busy_ticks(stat_text: str, cores: set[int] | None) -> tuple[int, int] | None:
    """(busy ticks, cores counted) from /proc/stat's text: the per-core lines of `cores` (all of them
    when None); busy = user + nice + system + irq + softirq + steal, i.e. the first eight fields less
    idle and iowait (guest time is already inside user and nice)."""
    busy, counted = 0, 0
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            core = int(name[3:])
            fields = [int(v) for v in rest.split()[:8]]
        except ValueError:
            continue
        if (cores is not None and core not in cores) or len(fields) < 5:
            continue
        busy += sum(fields) - fields[3] - fields[4]
        counted += 1
    return (busy, counted) if counted else None


def _stat_fields(text: str) -> list[str]:
    """The fields of a /proc/<pid>/stat after its command name (which may hold spaces and parens):
    [0] state, [1] ppid, ..., [11] utime, [12] stime, [13] cutime, [14] cstime."""
    return text[text.rindex(")") + 2 :].split()


def _ticks_of(pid: int, proc: Path) -> tuple[int, int] | None:
    """(parent pid, CPU ticks of the process and its reaped children), None once it is gone."""
    try:
        f = _stat_fields((proc / str(pid) / "stat").read_text())
        return int(f[1]), sum(int(v) for v in f[11:15])
    except (OSError, ValueError, IndexError):
        return None  # it ended while we read it, or is not readable


def _children(pid: int, proc: Path) -> list[int]:
    """The children of `pid` from its threads' `children` files."""
    kids: list[int] = []
    try:
        tids = os.listdir(proc / str(pid) / "task")
    except OSError:
        return kids
    for tid in tids:
        try:
            kids += [int(v) for v in (proc / str(pid) / "task" / tid / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return kids


def descendant_ticks(pid: int, proc: Path = PROC) -> int:
    """CPU ticks of the live descendants of `pid` (each one's own and its reaped children's).

    From the `children` files where the kernel has them (a few reads), else from the parent pid
    of every process (a scan of /proc, a few ms on a busy host)."""
    if (proc / str(pid) / "task" / str(pid) / "children").exists():
        todo, total, seen = _children(pid, proc), 0, set()
        while todo:
            p = todo.pop()
            got = None if p in seen else _ticks_of(p, proc)
            seen.add(p)
            if got is not None:
                total += got[1]
                todo += _children(p, proc)
        return total
    try:
        pids = [int(e) for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return 0
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for p in pids:
        got = _ticks_of(p, proc)
        if got is not None:
            children.setdefault(got[0], []).append(p)
            ticks[p] = got[1]
    todo, total, seen = list(children.get(pid, ())), 0, set()
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            total += ticks[p]
            todo += children.get(p, ())
    return total


def _own_s(proc: Path, hz: int) -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    live = descendant_ticks(os.getpid(), proc) / hz if proc.is_dir() else 0.0
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + live


def load_1m() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def snapshot(proc: Path = PROC) -> LoadSnapshot:
    """The counters now (`proc`: where /proc is, for tests)."""
    hz = _ticks_per_s()
    try:
        counted = busy_ticks((proc / "stat").read_text(), _cores())
    except OSError:
        counted = None
    busy, cores = counted if counted else (None, 0)
    return LoadSnapshot(
        wall_s=time.monotonic(),
        busy_s=None if busy is None else busy / hz,
        cores=cores,
        tick_s=1.0 / hz,
        own_s=_own_s(proc, hz),
        load_1m=load_1m(),
    )


def min_window_s(snap: LoadSnapshot) -> float:
    """The shortest window whose `foreign_cores` is judged (RESOLUTION_CORES)."""
    return 2 * snap.cores * snap.tick_s / RESOLUTION_CORES


def foreign_cores(before: LoadSnapshot, after: LoadSnapshot) -> float | None:
    """Cores' worth of CPU that processes other than this one (and its descendants) used on our
    cores between the two snapshots, on average (>= 0). None where there is no /proc/stat, or the
    window is too short for the tick counters to resolve it (`min_window_s`)."""
    wall = after.wall_s - before.wall_s
    if before.busy_s is None or after.busy_s is None or wall <= 0 or wall < min_window_s(after):
        return None
    return max(0.0, (after.busy_s - before.busy_s - (after.own_s - before.own_s)) / wall)


def free_cores(window_s: float = 0.4, probe=snapshot, sleep=time.sleep) -> float | None:
    """Cores of ours that other processes leave free, on average over `window_s` now (at least the
    window the tick counters resolve); None where it cannot be measured (no /proc/stat)."""
    before = probe()
    sleep(max(window_s, min_window_s(before)))
    after = probe()
    foreign = foreign_cores(before, after)
    return None if foreign is None else max(0.0, after.cores - foreign)


def threads_for(threads: int, free: float | None) -> int:
    """The intra-op threads a run that adapts takes: `threads`, or the free cores when fewer are free
    (rounded to the nearest, at least 1); `threads` itself when the free cores are unknown."""
    if free is None or threads <= 1:
        return threads
    return max(1, min(threads, int(free + 0.5)))


def load_rise_own_bound(before: LoadSnapshot, after: LoadSnapshot) -> float:
    """The most the 1-minute load average can have risen between the snapshots from this process's
    own work: it counts runnable threads, so a step on N threads raises it towards N whatever else
    runs. Our average busy cores over the window (own CPU seconds / wall) times the share of the
    average's pull the window allowed: 1 - exp(-updates x 5 s / 60 s), with one update more than
    the window's length holds (one may fall right after it began)."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return 0.0
    own_cores = max(0.0, after.own_s - before.own_s) / wall
    updates = math.floor(wall / LOADAVG_PERIOD_S) + 1
    return own_cores * (1 - math.exp(-updates * LOADAVG_PERIOD_S / 60.0))
