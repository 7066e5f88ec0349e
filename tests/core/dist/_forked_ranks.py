"""The ranks of a test's gloo world, forked from one process that imported torch and titan_core once:
`python _forked_ranks.py NPROC LOG_DIR SCRIPT ARGS...` (started by `launch` in _world.py).

Every rank of a world started by torchrun imports torch and titan_core itself (about 4 s of CPU each,
and torchrun's own start on top), which on a 2-core machine is most of a 4- or 8-rank launch. The
worker scripts of these tests need nothing of torchrun but its environment, so here the imports run
once and each rank is a fork of this process (as a DataLoader's workers are): RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT as torchrun sets them, OMP_NUM_THREADS as titan_core.launcher
sets it, its stdout and stderr into LOG_DIR/rank_<r>.log, SCRIPT run as its `__main__`. The first rank
to fail stops the others (SIGTERM), as torchrun does; LOG_DIR/result.json says which rank failed first
and how. A rank dies with this process (PR_SET_PDEATHSIG), and this process with its caller.
"""

from __future__ import annotations

import ctypes
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

SHUTDOWN_S = 3
"""How long a rank told to stop (SIGTERM) has before SIGKILL, as titan_core.launcher gives torchrun's."""
NPROC = int(sys.argv[1])
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // NPROC)))  # before torch reads it

import torch  # noqa: E402, F401 - the imports every rank would otherwise repeat
import torch.distributed.tensor  # noqa: E402, F401

import titan_core.training.trainer  # noqa: E402, F401


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, log_dir: Path, script: str, args: list[str]) -> int:
    """In the forked child: become rank `rank` and run `script`; its exit code."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with this launcher
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(NPROC), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE":
                       str(NPROC), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # fmt: skip
    log = os.open(log_dir / f"rank_{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in its log, as an uncaught exception would be
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main(log_dir: Path, script: str, args: list[str]) -> int:
    log_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    ranks = {}
    for rank in range(NPROC):
        pid = os.fork()
        if pid == 0:
            os._exit(_rank(rank, port, log_dir, script, args))
        ranks[pid] = rank
    failed: list[tuple[int, int]] = []  # (rank, exit code: negative for a signal), the first failure first
    stopped_at = None
    while ranks:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:  # none ended: a rank told to stop gets SHUTDOWN_S, then SIGKILL
            if stopped_at is not None and time.monotonic() - stopped_at > SHUTDOWN_S:
                _signal(ranks, signal.SIGKILL)
            time.sleep(0.05)
            continue
        rank, code = ranks.pop(pid), os.waitstatus_to_exitcode(status)
        if code != 0:
            failed.append((rank, code))
            if stopped_at is None:
                stopped_at = time.monotonic()
                _signal(ranks, signal.SIGTERM)
    (log_dir / "result.json").write_text(json.dumps({"failed": failed}))
    return 1 if failed else 0


def _signal(ranks: dict[int, int], sig: int) -> None:
    for pid in ranks:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[2]), sys.argv[3], sys.argv[4:]))
