"""One launch per world size for the whole session: every 2-rank (and every 4-rank) scenario of the
tests under tests/core (dist, parallel, compile) whose tests were collected runs in one gloo world
(_world_worker.py), one scenario after another in one process group; and `launch`, which starts a
world's ranks as forks of one process that imported torch and titan_core once (_forked_ranks.py).

Each launch through torchrun costs seconds of CPU before any rank trains (torchrun's own start, every
rank's imports of torch, titan_core and transformers, the rendezvous, the ranks leaving in order):
most of a 4- or 8-rank launch on a 2-core machine. The rank workers of these tests need nothing of
torchrun but its environment (titan_core.launcher itself is tested in test_launcher.py and
test_launch_failures.py), so their ranks are forked, and one launch per world size pays even that once.

A test module declares its scenario with `job` (its worker script and that worker's arguments, the
inputs written first) and reads the ranks' results with `results`: the first test of the session that
asks for any scenario of a world size launches every scenario of that size whose tests the session
collected (`ORDER` first), and each later one reads its own. A scenario that failed fails its own
tests with the launch's report, and those after it in the launch say which one stopped it; the
scenarios that finished before it keep their results.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import xdist_units

WORKER = Path(__file__).with_name("_world_worker.py")
FORKED = Path(__file__).with_name("_forked_ranks.py")
ORDER = ("sharded_init",)
"""Scenarios that run first in their launch: sharded_init measures its ranks' resident set, which
depends on what the process allocated and freed before it (its own cases only, as on its own)."""
BASE_S = {2: 900.0, 4: 900.0}
"""The hang guard of each launch on an idle machine (stretched for the load): the sum of its scenarios' runs,
2-3 minutes on an idle 2-core machine, with room."""


@dataclass(frozen=True)
class Job:
    name: str
    world: int
    worker: Path
    """The rank worker script (it opens `distributed.process_group`, which reuses the launch's group)."""
    args: Callable[[Path], list[str]]
    """Writes the scenario's inputs into its folder and returns the worker's arguments."""
    readers: tuple[Path, ...]
    """The test files that read its results: it runs when the session collected a test of one of them."""
    out: str = "out"
    """Where in its folder the worker writes rank_<r>.json."""


@dataclass
class Result:
    folder: Path
    """The scenario's folder (its inputs, and `out` below it)."""
    out: Path
    ranks: list[dict] = field(default_factory=list)
    """rank_<r>.json of every rank."""


_jobs: dict[str, Job] = {}
_done: dict[str, Result | BaseException | str] = {}
"""Per scenario, once its world has launched: its result, the exception its inputs raised (a skip
included), or the report of the launch that did not finish it."""


def job(name: str, world: int, worker: Path, args: Callable[[Path], list[str]], *readers: str | Path,
        out: str = "out") -> Job:  # fmt: skip
    """Declare a scenario (at import of the test module or conftest that reads it)."""
    j = Job(name, world, Path(worker), args, tuple(Path(r).resolve() for r in readers), out)
    repo = Path(__file__).resolve().parents[3]
    outside = [r for r in j.readers if not r.relative_to(repo).as_posix().startswith(xdist_units.WORLD_READERS)]
    assert not outside, f"{outside} read a gloo world: add them to tests/xdist_units.py's WORLD_READERS"
    _jobs[name] = j
    return j


def results(request: pytest.FixtureRequest, j: Job) -> Result:
    """`j`'s results; the first call for its world size launches every collected scenario of that size."""
    if j.name not in _done:
        _launch(request, j.world, must=j)
    got = _done[j.name]
    if isinstance(got, BaseException):
        raise got
    if isinstance(got, str):
        pytest.fail(got, pytrace=False)
    return got


def _collected(request: pytest.FixtureRequest) -> set[Path]:
    return {Path(str(item.path)).resolve() for item in request.session.items}


def _launch(request: pytest.FixtureRequest, world: int, must: Job) -> None:
    collected = _collected(request)
    wanted = [j for j in _jobs.values() if j.world == world and j.name not in _done]
    wanted = [j for j in wanted if j is must or set(j.readers) & collected]
    wanted.sort(key=lambda j: ORDER.index(j.name) if j.name in ORDER else len(ORDER))
    root = request.getfixturevalue("tmp_path_factory").mktemp(f"world{world}")
    specs, ran = [], []
    for j in wanted:
        folder = root / j.name
        folder.mkdir()
        try:
            args = j.args(folder)
        except (Exception, pytest.skip.Exception, pytest.fail.Exception) as e:  # its inputs: this scenario alone
            _done[j.name] = e
            continue
        (folder / j.out).mkdir(parents=True, exist_ok=True)
        specs.append({"name": j.name, "worker": str(j.worker), "argv": args, "out": str(folder / j.out)})
        ran.append((j, folder))
    if not specs:
        return
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(specs, indent=1))
    names = ", ".join(s["name"] for s in specs)
    failure = launch(WORKER, [str(jobs_file)], world, BASE_S[world], f"{WORKER.name} {world} ranks ({names})",
                     root / "logs")  # fmt: skip
    stopped = next((j.name for j, folder in ran if not (folder / j.out / "done").is_file()), None)
    for j, folder in ran:
        out = folder / j.out
        if (out / "done").is_file():
            ranks = [json.loads((out / f"rank_{r}.json").read_text()) for r in range(world)]
            _done[j.name] = Result(folder, out, ranks)
        else:
            _done[j.name] = f"the {world}-rank world of [{names}] stopped in {stopped}:\n{failure or 'no result'}"


def launch(script: Path, args: list[str], nproc: int, base_s: float, what: str, log_dir: Path) -> str | None:
    """Run `script ARGS` as ranks 0..nproc-1 of one gloo world (_forked_ranks.py), each rank's output in
    log_dir/rank_<r>.log; None when every rank exited 0, else the report of the first that failed (its
    exit code, its exception and the tail of its output), or of the hang guard (`base_s` for the load)."""
    from hang_guard import HangGuard

    from titan_core.launcher import exception_line
    from titan_core.runtime.die_with_parent import with_parent_death_signal

    log_dir.mkdir(parents=True, exist_ok=True)
    guard = HangGuard(what, base_s)
    cmd = [sys.executable, str(FORKED), str(nproc), str(log_dir), str(script), *args]
    with open(log_dir / "launcher.log", "w") as said:
        proc = subprocess.Popen(with_parent_death_signal(cmd), stdout=said, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=guard.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank: one process group
            proc.wait()
            timed_out = True
    tails = {r: _tail(log_dir / f"rank_{r}.log") for r in range(nproc)}
    if timed_out:
        return f"{guard.message()}; the last lines of rank 0 ({log_dir}):\n{_block(tails[0])}"
    if proc.returncode == 0:
        return None
    try:
        failed = json.loads((log_dir / "result.json").read_text())["failed"]
    except (OSError, ValueError, KeyError):
        return f"error: the launcher of {what} failed (exit code {proc.returncode}):\n{_block(_tail(said.name))}"
    # ranks that fail together (one raised, its peers then lost it in a collective) are told apart by
    # their own output only: each one that was not stopped is reported with its exception and its tail
    parts = []
    for k, (rank, code) in enumerate(failed):
        if code == -signal.SIGTERM:
            parts.append(f"rank {rank} stopped")
            continue
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        raised = exception_line(tails[rank])
        parts.append(f"{'error: ' if k == 0 else ''}rank {rank} of {nproc} {'failed first' if k == 0 else 'failed'} "
                     f"({how}){f': {raised}' if raised else ''}; the last lines of its output "
                     f"({log_dir}/rank_{rank}.log):\n{_block(tails[rank])}")  # fmt: skip
    return "\nthen ".join(parts)


def _tail(path: Path | str, n: int = 30) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def _block(lines: list[str]) -> str:
    return "\n".join(f"  | {line}" for line in lines) if lines else "  | (no output)"


__all__ = ["Job", "Result", "job", "launch", "results"]
