"""The demo's ladder climbed on a busy machine: does every timing decision still decide, within its budget?

Starts one busy process per core of this machine (a Python loop, the foreign load a shared box
has), climbs the demo model with the checklists' own timing protocol (`onboard demo --no-train`),
stops the load, and prints JSON:

- `decisions`: every Decision record of the ladder (rung, lever, holder, candidate, verdict, the
  speed-up with its interval, and the load the comparison recorded beside it);
- `threads`: the tuning rung's device.threads decision and what the recipe holds after the climb;
- `rung_seconds`: each attempt's wall time (the kernels rung against its budget, `params.timing.budget_s`
  of checklists/kernels.yaml plus its correctness checks);
- `unpaired_with_outcome`: every line of the climb's outputs (its log, ladder.json, REPORT.md,
  recipe.toml, status) that says "unpaired" next to an outcome word: should be empty.

    python bench/climb_under_load.py [--dir DIR] [--busy N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ONBOARD = Path(sys.executable).parent / "onboard"
OUTCOME = re.compile(r"\b(faster|slower|indistinguishable|kept|held)\b")


def busy_processes(n: int) -> list[subprocess.Popen]:
    """`n` processes each spinning one core until killed."""
    spin = "while True:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()


def seconds(entry: dict) -> float | None:
    try:
        return (datetime.fromisoformat(entry["ended"]) - datetime.fromisoformat(entry["started"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def unpaired_lines(texts: dict[str, str]) -> list[str]:
    """Lines that print an unpaired figure with an outcome word (none should)."""
    return [f"{name}: {line.strip()[:200]}" for name, text in texts.items() for line in text.splitlines()
            if "unpaired" in line and OUTCOME.search(line)]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("climb-under-load"), help="folder for the demo workspace")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    ap.add_argument("--out", default="", help="also write the JSON here")
    opts = ap.parse_args()

    base = opts.dir.resolve()
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    load = busy_processes(opts.busy)
    started = time.monotonic()
    try:
        run = subprocess.run([str(ONBOARD), "demo", "--dir", str(base), "--force", "--no-train", "--device", "cpu"],
                             capture_output=True, text=True, env=env)  # fmt: skip
        status = subprocess.run([str(ONBOARD), "status", "llama3_debug", "--dir", str(base)], capture_output=True,
                                text=True, env=env)  # fmt: skip
    finally:
        stop(load)
    wall = time.monotonic() - started
    ws = base / "onboarding" / "llama3_debug"
    ledger = json.loads((ws / "ladder.json").read_text()) if (ws / "ladder.json").is_file() else {"attempts": []}
    decisions = [{"rung": e["rung"], **{k: d.get(k) for k in ("lever", "holder", "candidate", "verdict", "speedup",
                                                               "ci", "load", "why")}}
                 for e in ledger["attempts"] for d in ((e.get("details") or {}).get("decisions") or [])
                 if isinstance(d, dict)]  # fmt: skip
    texts = {"demo stdout": run.stdout, "demo stderr": run.stderr, "status": status.stdout,
             "ladder.json": json.dumps(ledger)}  # fmt: skip
    for name in ("REPORT.md", "recipe.toml"):
        if (ws / name).is_file():
            texts[name] = (ws / name).read_text()
    recipe = texts.get("recipe.toml", "")
    held = re.search(r"^threads\s*=\s*(\d+)", recipe, re.M)
    report = {
        "benchmark": "climb_under_load",
        "busy_processes": opts.busy,
        "cpu_count": os.cpu_count(),
        "exit_code": run.returncode,
        "wall_s": wall,
        "decisions": decisions,
        "threads": {"decisions": [d for d in decisions if d["lever"] == "device.threads"],
                    "recipe_holds": int(held.group(1)) if held else None},  # fmt: skip
        "not_measured": [f"{d['rung']} {d['lever']}={d['candidate']}" for d in decisions
                         if d["verdict"] == "not measured"],  # fmt: skip
        "rung_seconds": [{"rung": e["rung"], "attempt": e.get("attempt"), "seconds": seconds(e)}
                         for e in ledger["attempts"]],  # fmt: skip
        "unpaired_with_outcome": unpaired_lines(texts),
    }
    if run.returncode != 0:
        report["stderr_tail"] = run.stderr[-3000:]
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
