"""A rank that behaves as a test asks (argv: MODE MARKER_FILE), without torch: it starts in a fraction of
a second, so the launchers' handling of a refusal and of a killed rank is tested under real torchrun
in seconds.

- refuse-all: every rank refuses bad input (titan_core.train's `refuse`: local rank 0 prints, the
  others write torchrun's error file) and exits 2; rank 1 refuses once rank 0 has (the marker file), as
  when rank 1 is slower to reach the check: a rank 1 that refused first could have torchrun stop rank 0
  before its print, which refuse-rank1 is for;
- refuse-rank1: rank 1 refuses, rank 0 waits to be stopped;
- killed: rank 0 prints a line, then waits; on torchrun's SIGTERM it prints a traceback as a rank that
  lost its peer in a collective does, and exits 1. Rank 1 waits for rank 0's line (the marker file)
  and kills itself with SIGKILL, as `kill -9` or the out-of-memory killer would.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from titan_core.train import refuse

REFUSAL = "data.path 'missing.jsonl' does not exist"
TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 1, in <module>',
             "RuntimeError: Connection reset by peer"]  # fmt: skip


def _peer_lost(*_):
    print("\n".join(TRACEBACK), file=sys.stderr, flush=True)
    sys.exit(1)


def _wait_for(marker: Path) -> None:
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def main(mode: str, marker: Path) -> int:
    rank = int(os.environ["RANK"])
    if mode == "refuse-all" and rank == 0:
        code = refuse(REFUSAL)
        marker.touch()
        return code
    if mode == "refuse-all":
        _wait_for(marker)
    if mode in ("refuse-all", "refuse-rank1") and rank == 1:
        return refuse(REFUSAL)
    if mode == "killed" and rank == 0:
        signal.signal(signal.SIGTERM, _peer_lost)
        print("step=1 loss=5.5", flush=True)
        marker.touch()
    elif mode == "killed":
        _wait_for(marker)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # stopped by torchrun once the other rank has failed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
