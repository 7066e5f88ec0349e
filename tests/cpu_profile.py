"""Where the suite's CPU goes: a pytest plugin and its summary.

    PYTHONPATH=tests CPU_PROFILE_DIR=/tmp/prof PYTEST_ADDOPTS="-p cpu_profile" make test
    .venv/bin/python tests/cpu_profile.py /tmp/prof [N]

Each process running tests (every pytest-xdist worker) writes one rows_<pid>.json into CPU_PROFILE_DIR
(default: cpu-profile in the temporary folder): per test its node id,
wall seconds, and the user and system CPU of the process and its waited-for children over the test
(getrusage). A test's ranks, climbs and CLI runs are children, so they count; a background climb counts
in the test that waits for it. On a machine the suite keeps busy, wall time is the summed CPU over the
cores, so the CPU, not a test's wall time, says what a test costs the suite. The summary prints JSON:
the totals, the N costliest files and tests.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

_ROWS: list[list] = []


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + kids.ru_utime, own.ru_stime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, (user, system) = time.perf_counter(), _cpu()
    yield
    user2, system2 = _cpu()
    _ROWS.append([item.nodeid, time.perf_counter() - start, user2 - user, system2 - system])


def pytest_sessionfinish(session):
    if not _ROWS:  # the xdist controller runs no test
        return
    folder = Path(os.environ.get("CPU_PROFILE_DIR") or Path(tempfile.gettempdir()) / "cpu-profile")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rows_{os.getpid()}.json").write_text(json.dumps(_ROWS))


def summary(folder: Path, n: int = 20) -> dict:
    rows = [r for f in sorted(folder.glob("rows_*.json")) for r in json.loads(f.read_text())]
    by_file: Counter = Counter()
    for node, _, user, system in rows:
        by_file[node.split("::")[0]] += user + system
    costliest = sorted(rows, key=lambda r: -(r[2] + r[3]))[:n]
    return {
        "tests": len(rows),
        "cpu_s": round(sum(r[2] + r[3] for r in rows), 1),
        "wall_s_summed": round(sum(r[1] for r in rows), 1),
        "files": [{"file": f, "cpu_s": round(c, 1)} for f, c in by_file.most_common(n)],
        "tests_costliest": [{"test": r[0], "cpu_s": round(r[2] + r[3], 1), "wall_s": round(r[1], 1)} for r in costliest],
    }


if __name__ == "__main__":
    top = sys.argv[2] if len(sys.argv) == 3 else "20"
    if len(sys.argv) not in (2, 3) or not Path(sys.argv[1]).is_dir() or not top.isdigit():
        print("usage: cpu_profile.py FOLDER [N]  (FOLDER: the CPU_PROFILE_DIR of a profiled run; N: how many "
              "files and tests to list)", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(summary(Path(sys.argv[1]), int(top)), indent=1))
