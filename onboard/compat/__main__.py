"""`python -m onboard.compat MODEL_TYPE OUT.json`: one probe (the sweep's child process), its row
written to OUT.json after every rung; the rungs' own log on stderr, a line per rung prefixed `compat: `."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from onboard.compat.climb import probe
from onboard.workspace.fsutil import atomic_write_text


def main(argv: list[str]) -> int:
    model_type, out = argv
    work = Path(out).parent / "work"
    work.mkdir()

    def save(row: dict) -> None:
        atomic_write_text(Path(out), json.dumps(row))  # the sweep may kill this process mid-write

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    save(probe(model_type, work, log=say, save=save, detail=say))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
