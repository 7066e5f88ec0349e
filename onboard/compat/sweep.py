"""The sweep: one isolated probe per model_type (a child process with a time limit), the table of their
cells, and the files it is kept in (rewritten after every architecture)."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from onboard.compat.climb import rungs
from onboard.compat.table import check_destinations, replaced_tables, write_tables
from onboard.compat.causal import NOT_CAUSAL
from onboard.compat.tiny import causal_lm_types, one_line
from onboard.errors import BadInput, Interrupted
from onboard.workspace.fsutil import backup_aside
from titan_core.runtime.die_with_parent import with_parent_death_signal

TIMEOUT_S = 900
"""Wall-clock limit of one architecture's probe (all seven rungs)."""
POLL_S = 0.2
"""How often the sweep's main thread wakes to take a Ctrl-C while probes run."""
TAIL_LINES = 40
"""Lines of a probe's own output kept to explain a probe process that died."""


def run_isolated(
    model_type: str, *, timeout: float = TIMEOUT_S, log: Callable[[str], None] = lambda s: None, threads: int = 0
) -> dict:
    """`probe` in a child process with a time limit; a crash or a timeout fails the rung it was on.
    `threads` > 0 caps the child's (and its ranks') intra-op threads, for probes run side by side."""
    with tempfile.TemporaryDirectory(prefix="onboard-compat-") as tmp:
        out = Path(tmp) / "probe.json"
        cmd = with_parent_death_signal([sys.executable, "-m", "onboard.compat", model_type, str(out)])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        start = time.monotonic()
        failure = _run_child(cmd, tmp, env, timeout, log)
        seconds = round(time.monotonic() - start, 1)
        row = json.loads(out.read_text()) if out.is_file() else {"cells": {}}
    if failure and "not_probed" not in row:
        row["cells"] = fail_unfinished(row["cells"], one_line(failure))
    row["seconds"] = seconds
    return row


def _run_child(cmd: list[str], cwd: str, env: dict, timeout: float, log: Callable[[str], None]) -> str | None:
    """Run the probe; its `compat: ` lines go to `log`. None, or why it did not end by itself with 0.

    Its own session, so a Ctrl-C reaches only this process, which then stops the probe's whole
    process group (its ranks die with it: they ask for a signal when their parent dies)."""
    with _STARTING:  # a Ctrl-C either sees this probe among the live ones or stops it from starting
        if _STOPPING.is_set():
            return "the sweep was interrupted"
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        _LIVE.add(proc)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, tail, log), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"probe exceeded {timeout:.0f} s"
    finally:
        _stop(proc)
        _LIVE.discard(proc)
        reader.join(timeout=5)
    if code == 0:
        return None
    last = next((line for line in reversed(tail) if line.strip()), "no output")
    return f"probe process exited {code}: {last}"


_LIVE: set[subprocess.Popen] = set()
"""The probe processes running now (several with --jobs): a Ctrl-C stops every one."""
_STOPPING = threading.Event()
_STARTING = threading.Lock()
"""Held while a probe checks _STOPPING and starts, and while a Ctrl-C sets it and reads _LIVE."""
"""Set by a Ctrl-C: no probe starts after it."""


def _stop(proc: subprocess.Popen) -> None:
    """Kill `proc`'s process group (the probe and its ranks) if it still runs."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _read_lines(stream, tail: collections.deque, log: Callable[[str], None]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line)
        if line.startswith("compat: "):
            log(line)


def fail_unfinished(cells: dict[str, dict], failure: str) -> dict[str, dict]:
    """The cells a probe wrote before it died, the rung it was on failed with `failure` (unless one it
    recorded failed already), the rungs after the failed one not reached."""
    out, stopper = {}, None
    for rung in rungs():
        cell = cells.get(rung) or {"status": "not_reached", "reason": "pending"}
        if stopper:
            cell = {"status": "not_reached", "reason": f"the {stopper} rung failed"}
        elif cell["status"] == "not_reached":
            cell = {"status": "fail", "reason": failure}
        if cell["status"] == "fail":
            stopper = stopper or rung
        out[rung] = cell
    return out


def sweep(
    model_types: list[str] | None = None,
    *,
    timeout: float = TIMEOUT_S,
    log: Callable[[str], None] = lambda s: None,
    previous: dict | None = None,
    on_row: Callable[[dict], None] = lambda result: None,
    jobs: int = 1,
) -> dict:
    """The compat table of `model_types` (default: every causal LM); `previous` (a table of the same
    transformers and rungs) gives rows kept without probing again; `on_row(table so far)` after each
    architecture; `jobs` probes at a time (each then capped at cpu_count / jobs threads). A Ctrl-C
    (or a SIGTERM raising Interrupted) ends it with the rows that finished and `interrupted` naming
    the ones it stopped; their probes are killed and their temp folders removed before it returns."""
    types = model_types or causal_lm_types()
    kept_rows, kept_not = (previous or {}).get("rows", {}), (previous or {}).get("not_probed", {})
    # the kept rows are in the table from the start: an interrupt before the pool reaches one must
    # not drop it from the results file a --resume reads
    rows = {mt: kept_rows[mt] for mt in types if mt in kept_rows}
    not_probed = {mt: kept_not[mt] for mt in types if mt in kept_not and mt not in rows}
    running = set()
    lock = threading.Lock()
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else 0

    def one(i: int, mt: str) -> None:
        with lock:
            running.add(mt)
        row = _one(mt, f"[{i}/{len(types)}]", kept_rows, kept_not, timeout, log, threads)
        with lock:
            running.discard(mt)
            if not _STOPPING.is_set():
                (not_probed if isinstance(row, str) else rows)[mt] = row
                on_row(table_now())

    interrupted = None
    start, earlier = time.monotonic(), float((previous or {}).get("wall_seconds") or 0.0)

    def table_now(**kw) -> dict:
        return table(types, rows, not_probed, wall_seconds=earlier + time.monotonic() - start, **kw)

    _STOPPING.clear()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = [pool.submit(one, i, mt) for i, mt in enumerate(types, 1)]
        # a timed wait: a blocking one is interrupted only when the kernel hands SIGINT to this
        # thread, and with torch's and the pool's threads about it often hands it to another
        while not all(f.done() for f in futures):
            concurrent.futures.wait(futures, timeout=POLL_S)
        for f in futures:
            f.result()
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C, or SIGTERM where the CLI made it raise
        with _STARTING:
            _STOPPING.set()
            live = list(_LIVE)
        for proc in live:
            _stop(proc)
        interrupted = ", ".join(sorted(running)) or None
        log(f"compat: interrupted while probing {interrupted}")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return table_now(interrupted=interrupted)


def _one(
    mt: str,
    where: str,
    kept_rows: dict,
    kept_not: dict,
    timeout: float,
    log: Callable[[str], None],
    threads: int,
) -> dict | str:
    """`mt`'s row (or its earlier row), or why it is not probed."""
    if mt in kept_rows or mt in kept_not:
        log(f"compat: {where} {mt}: kept from the results file")
        return kept_rows.get(mt) or kept_not[mt]
    log(f"compat: {where} {mt}")
    row = run_isolated(mt, timeout=timeout, log=log, threads=threads)
    if "not_probed" in row:
        log(f"compat: {mt}: not probed: {row['not_probed']}")
        return row["not_probed"]
    cells = ", ".join(f"{r} {c['status']}" for r, c in row["cells"].items())
    log(f"compat: {mt}: {cells} ({row['seconds']} s)")
    return row


def table(
    types: list[str], rows: dict, not_probed: dict, *, interrupted: str | None = None, wall_seconds: float = 0.0
) -> dict:
    """The sweep's result (the --json output and the results file): cells per model_type, counts per
    rung, the date (UTC) it was last written and its wall time (a resumed sweep's runs summed).
    `counted`: the requested types less those measured not to be causal LMs at all (`not_causal`,
    listed among the not probed), the base the pass rates are given against."""
    import transformers  # lazy: an optional extra (check_types said so before any probe)

    names = rungs()
    ordered = {mt: rows[mt] for mt in types if mt in rows}
    not_causal = [mt for mt in types if str(not_probed.get(mt, "")).startswith(NOT_CAUSAL)]
    return {
        "transformers": transformers.__version__,
        "rungs": names,
        "requested": len(types),
        "probed": len(ordered),
        "passing": {r: sum(row["cells"][r]["status"] == "pass" for row in ordered.values()) for r in names},
        "all_pass": sum(all(row["cells"][r]["status"] == "pass" for r in names) for row in ordered.values()),
        "eager_and_parity": sum(
            all(row["cells"][r]["status"] == "pass" for r in ("eager", "parity")) for row in ordered.values()
        ),
        "rows": ordered,
        "not_probed": {mt: not_probed[mt] for mt in types if mt in not_probed},
        "not_causal": not_causal,
        "counted": len(types) - len(not_causal),
        "remaining": [mt for mt in types if mt not in rows and mt not in not_probed],
        "interrupted": interrupted,
        "seconds": round(sum(row["seconds"] for row in ordered.values()), 1),
        "wall_seconds": round(wall_seconds, 1),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def load_previous(path: Path) -> dict | None:
    """The table a results file holds, for --resume (None when there is none yet); BadInput when it
    is not one, or one of another transformers or another set of rungs (its cells would not say
    what this installation runs)."""
    import transformers  # lazy: an optional extra (check_types said so before any probe)

    if not path.exists():
        return None
    try:
        prev = json.loads(path.read_text())
        rows, not_probed, version, names = prev["rows"], prev["not_probed"], prev["transformers"], prev["rungs"]
        if not (isinstance(rows, dict) and isinstance(not_probed, dict)):
            raise TypeError("rows and not_probed must be objects")
        for mt, row in rows.items():
            if set(row["cells"]) != set(names) or not isinstance(row["seconds"], (int, float)):
                raise TypeError(f"row {mt!r} has no cell per rung or no seconds")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"--resume: {path} is not a compat results file ({type(e).__name__}: {e})") from None
    if version != transformers.__version__ or names != rungs():
        raise BadInput(
            f"--resume: {path} holds a sweep of transformers {version}, rungs {', '.join(names)}; this "
            f"installation runs transformers {transformers.__version__}, rungs {', '.join(rungs())}: drop --resume "
            "and pass --force to start over (the file is then kept as a backup)"
        )
    return prev


def sweep_to_files(
    model_types: list[str] | None,
    *,
    timeout: float,
    markdown: Path | None,
    results: Path | None,
    resume: bool,
    log: Callable[[str], None],
    jobs: int = 1,
    force: bool = False,
) -> dict:
    """`sweep`, its table written to `results` (JSON) and `markdown` after every architecture and at the
    end; with `resume`, the rows `results` already holds are kept. Bad input raises before any probe runs,
    and so does a table file the sweep would replace without `force` (table.py: `replaced_tables`); with
    `force` each is moved to a backup first, which the table names (`backup`, `markdown_backup`)."""
    if timeout <= 0:
        raise BadInput(f"--timeout {timeout}: must be > 0 seconds")
    if jobs < 1:
        raise BadInput(f"--jobs {jobs}: must be at least 1")
    if resume and results is None:
        raise BadInput("--resume needs --results PATH: the file the earlier sweep kept its rows in")
    check_destinations(markdown, results)
    previous = load_previous(results) if resume else None
    replaced = replaced_tables(results, markdown, resume=resume, previous=previous,
                               types=model_types or causal_lm_types())  # fmt: skip
    if replaced and not force:
        raise BadInput(replaced[0][2])
    backups = {"backup": None, "markdown_backup": None}
    for key, path, _ in replaced:
        backups[key] = str(backup_aside(path))
        log(f"compat: the earlier {path.name} is kept as {backups[key]}")
    cmd = " ".join(["onboard compat", *(model_types or [])])
    header = f"# Compatibility\n\nGenerated by `{cmd}`."

    def write(result: dict) -> None:
        write_tables({**result, **backups}, markdown=markdown, results=results, header=header)

    result = sweep(model_types, timeout=timeout, log=log, previous=previous, on_row=write, jobs=jobs)
    write(result)
    return {**result, **backups}
