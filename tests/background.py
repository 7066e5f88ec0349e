"""The suite's whole-ladder climbs, run in the background from the start of the session.

`onboard demo` (test_demo.py), the port's climb (test_port_ladder.py, port_climb.py) and the bf16
recipe's climb over the rungs whose bounds depend on precision (test_bf16_ladder.py, bf16_climb.py)
are minutes of mostly one-thread work each, and the rest of the suite leaves a core idle for much of
its time. So tests/conftest.py starts a climb once the session's tests are collected (`start`,
only for a job whose test is among them) and runs that test last; the test then waits for its
climb (`wait`) under a load-aware hang guard and asserts on what it left on disk.

Beside other tests a climb runs in the idle scheduling class (`_idle_class`): it takes the CPU
they leave idle and yields it whenever they want it. It still slows them some (caches, memory
bandwidth, a core's wake-up), but far less than at a positive nice. A test marked `whole_machine`
(ranks that meet at every collective) runs with the climbs stopped altogether (`pause_all`, from
tests/conftest.py). A session that ends before the tests (-x, Ctrl-C) stops each climb's whole
process group (`stop_all`); one killed outright takes them with it (a parent-death signal).

Imported by tests/conftest.py, which must not import onboard (tests/core runs without it): the
climbs are subprocesses and this module imports nothing of the project but titan_core's
die_with_parent (the standard library only).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hang_guard import HangGuard, Load

from titan_core.runtime.die_with_parent import with_parent_death_signal

E2E_TESTS = Path(__file__).resolve().parent / "onboard" / "e2e"


def _idle_class() -> None:
    """Put this (child) process in SCHED_IDLE; its ranks and parity's pytest inherit it.

    At nice 10 a climb still took timeslices from the suite's multi-rank tests, whose ranks meet at
    every collective: a rank kept waiting stalls the other (the 2-rank Graph Trainer test ran 40 s
    beside nice-10 climbs, 14 s alone). The kernel runs a SCHED_IDLE task only on a core no other
    task wants and preempts it when one does; the same test then took 27 s, not 14: the climb still
    shares caches and memory bandwidth, and a rank that wakes may wait for its core. Where the class
    is refused, nice 19 is the next best."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def _own_temp(base: Path, own_cache: bool = True) -> dict[str, str]:
    """The environment with temporary and cache folders of the climb's own.

    A climb that holds a lock the suite's process then needs stops the suite for as long as the climb
    is held back: paused, for the 600 s of a lock timeout (inductor's precompiled-header lock lives in
    the temporary folder, not in TORCHINDUCTOR_CACHE_DIR: the per-block inductor test timed out on it
    behind a paused climb), or preempted in the idle class. So nothing on disk that has a lock is shared,
    but with a climb that is neither (`own_cache=False`: a climb of a pytest-xdist worker, in its own test,
    in the normal class): it compiles into the session's inductor cache."""
    own = {"TMPDIR": base / "tmp", "TORCHINDUCTOR_CACHE_DIR": base / "inductor-cache", "MPLCONFIGDIR": base / "mpl"}
    if not own_cache:  # a climb never paused nor preempted: the session's warm kernels are its own as well
        del own["TORCHINDUCTOR_CACHE_DIR"]
    for folder in own.values():
        folder.mkdir()
    return {**os.environ, **{k: str(v) for k, v in own.items()}}


@dataclass(frozen=True)
class Job:
    test: str
    """The node id of the test that asserts on the climb (pytest's, from the repository root)."""
    what: str
    """What runs, as a hang guard's failure names it."""
    argv: Callable[[Path, bool], list]
    """The command, given the job's folder (a temporary folder of this session) and whether it is shared."""
    hang_guard_s: float
    """Its hang guard on an idle machine (hang_guard.HangGuard's base)."""


def demo_timing(shared: bool) -> str:
    """The timing profile the demo climbs with: beside the rest of the suite, a keep/choose decision
    times the other tests' noise, and the shipped protocol's rounds (each comparison up to 30-60 s)
    buy wall time and no truer answer, so it climbs with `quick`; alone, it is `make demo`'s own run."""
    return "quick" if shared else "shipped"


JOBS = {
    "port": Job(
        "tests/onboard/e2e/test_port_ladder.py::test_a_port_climbs_the_ladder_and_its_recipe_reproduces_the_gates",
        "the port's climb (port_climb.py)",
        lambda base, shared: [sys.executable, E2E_TESTS / "port_climb.py", base],
        600,
    ),
    "bf16": Job(
        "tests/onboard/e2e/test_bf16_ladder.py::test_a_bf16_recipe_climbs_every_rung_judged_by_bf16s_bounds",
        "the bf16 recipe's climb (bf16_climb.py)",
        lambda base, shared: [sys.executable, E2E_TESTS / "bf16_climb.py", base],
        600,
    ),
    "demo": Job(
        "tests/onboard/e2e/test_demo.py::test_demo_climbs_every_built_rung_and_prints_the_ladder",
        "onboard demo",
        lambda base, shared: [Path(sys.executable).parent / "onboard", "demo", "--dir", base / "demo", "--timing", demo_timing(shared)],
        600,
    ),
}
"""The climbs, in the order their tests run at the end of the session."""


@dataclass
class Run:
    """One job started in the background."""

    job: Job
    base: Path
    """The job's folder; its stdout and stderr are files here."""
    shared: bool
    """Other tests of the session run beside it (its test runs last, and the climb in the idle class): its wall
    time is then not the climb's on a machine of its own."""
    proc: subprocess.Popen
    started: float = field(default_factory=time.perf_counter)
    start_load: Load = field(default_factory=Load.now)
    """The load when it started; a shared climb counts the suite's own process on top of it."""
    waiting_since: float | None = None
    """When its test began to wait for it: from then on a shared climb has the machine (but for the
    climbs whose tests come after)."""
    paused_at: float | None = None
    """When `pause` stopped it (None while it runs)."""
    paused_s: float = 0.0
    """How long it was stopped in all, for tests that wanted the whole machine."""
    ended: float | None = None
    """When its process ended (a watcher thread's clock: a climb may end long before its test)."""

    @property
    def stdout(self) -> Path:
        return self.base / "stdout.txt"

    @property
    def stderr(self) -> Path:
        return self.base / "stderr.txt"

    def watch(self) -> None:
        self.proc.wait()
        self.ended = time.perf_counter()

    def guard(self) -> HangGuard:
        """The climb's hang guard, fixed from the load when it started."""
        what = self.job.what
        if self.shared:
            what += " (beside the rest of the suite from its start: the suite's process counted in the load at start)"
        return HangGuard(what, self.job.hang_guard_s, start=self.start_load)


_runs: dict[str, Run] = {}


def xdist_worker() -> bool:
    """This process is a pytest-xdist worker: the session's tests are split between two of them, so a
    climb runs in its own test, beside the other worker (in the normal scheduling class: a climb in the
    idle class would wait for every test of the other worker)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def start(name: str, *, shared: bool, idle: bool | None = None, own_cache: bool = True) -> Run:
    """Start job `name` in a new process group (its ranks and parity's pytest with it), output to
    files: a pipe nobody reads until the end would fill and stop it. A shared climb runs in the idle
    scheduling class unless `idle` says otherwise."""
    job = JOBS[name]
    base = Path(tempfile.mkdtemp(prefix=f"pytest-background-{name}-"))
    with open(base / "stdout.txt", "w") as out, open(base / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            # a session killed outright (SIGTERM from a timeout, SIGKILL) runs no sessionfinish: the
            # climb would live on and load the machine for minutes
            with_parent_death_signal([str(a) for a in job.argv(base, shared)]),
            stdout=out,
            stderr=err,
            text=True,
            env=_own_temp(base, own_cache),
            start_new_session=True,
            preexec_fn=_idle_class if (shared if idle is None else idle) else None,
        )
    load = Load.now()
    if shared:  # the suite's own process runs beside it from now on, before the load average sees it
        load = Load(load.average + 1, load.cores)
    run = _runs[name] = Run(job=job, base=base, shared=shared, proc=proc, start_load=load)
    threading.Thread(target=run.watch, name=f"background {name}", daemon=True).start()
    return run


def started(name: str) -> Run:
    if name not in _runs and xdist_worker():
        return start(name, shared=True, idle=False, own_cache=False)
    assert name in _runs, f"the background {name} climb was not started (tests/conftest.py starts it)"
    return _runs[name]


def wait(name: str) -> tuple[Run, subprocess.CompletedProcess, float]:
    """(the run, its finished process, its wall time in seconds). Past the hang guard's timeout the
    climb is stopped and the test fails with the load and its last output. The timeout counts from
    the climb's start, or, for a shared climb, from now: until its test, the suite had the machine."""
    run = started(name)
    resume_all()
    g = run.guard()
    run.waiting_since = time.perf_counter()
    left = g.timeout_s - (0.0 if run.shared else run.waiting_since - run.started)
    try:
        run.proc.wait(timeout=max(left, 1.0))
    except subprocess.TimeoutExpired:
        _stop(run)
        g.fail(f"last output:\n{_tail(run.stderr)}")
    wall = (run.ended or time.perf_counter()) - run.started
    done = subprocess.CompletedProcess(run.proc.args, run.proc.returncode, run.stdout.read_text(), _tail(run.stderr))
    return run, done, wall


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _stop(run: Run) -> None:
    if run.proc.poll() is not None:
        return
    try:
        os.killpg(run.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    run.proc.wait()


def _tree(root: int) -> list[int]:
    """`root` and its descendants now (the launcher starts each rank in a session of its own, so a
    climb's process group does not hold its ranks)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _signal_tree(run: Run, sig: int) -> None:
    if run.proc.poll() is not None:
        return
    sent: set[int] = set()
    while todo := [p for p in _tree(run.proc.pid) if p not in sent]:  # parents first: none forks after its stop
        for pid in todo:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            sent.add(pid)


def pause(run: Run) -> None:
    """Stop a running climb with all its processes (SIGSTOP), for a test that wants the whole machine.

    The idle class keeps a climb off a core the suite's process wants, but a test whose ranks meet at
    every collective still ran twice as long beside the climbs: a rank that blocks frees its core to a
    climb, and waking it costs a preemption and caches. A pause of tens of seconds is far inside the
    climbs' collective timeout (300 s), and their timed decisions see it as one noisy sample."""
    if run.paused_at is None:
        _signal_tree(run, signal.SIGSTOP)
        run.paused_at = time.perf_counter()


def resume(run: Run) -> None:
    if run.paused_at is not None:
        _signal_tree(run, signal.SIGCONT)
        run.paused_s += time.perf_counter() - run.paused_at
        run.paused_at = None


def pause_all() -> None:
    for run in _runs.values():
        pause(run)


def resume_all() -> None:
    for run in _runs.values():
        resume(run)


def stop_all() -> None:
    """Stop every climb still running (a session that ended before its test)."""
    for run in _runs.values():
        _stop(run)


def clean_all() -> None:
    """Remove the climbs' folders (a session that passed; a failed one keeps them to read)."""
    for run in _runs.values():
        if run.proc.poll() is not None:
            shutil.rmtree(run.base, ignore_errors=True)
