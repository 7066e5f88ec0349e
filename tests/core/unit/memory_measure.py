"""The memory estimate's calibration runs: each (family, batch, policy) of GRID trains in a fresh
process and prints the trainer's own estimate beside its own measured peak; two run at a time.

`python tests/core/unit/memory_measure.py OUT` writes OUT/rows.json (a list of those rows) and
prints it. tests/background.py runs it from the start of the session, beside the other tests (a
peak of resident memory does not depend on the CPU time a process gets); test_memory_estimate.py
asserts on the rows. Nothing of the project is imported here: each run is its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MEASURE = r"""
import json, sys
from pathlib import Path
from titan_core.config import load_config
from titan_core.training.trainer import Trainer

def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

cfg = load_config(None, sys.argv[1:])
base = rss()
trainer = Trainer(cfg, quiet=True)
estimate = trainer.memory_estimate
rows = trainer.train().metrics
print(json.dumps({"estimate": estimate.total, "phase": estimate.phase,
                  "measured": max(r["peak_mem_bytes"] for r in rows) - base}))
"""

GRID = [("llama3", 2, "none"), ("llama3", 8, "default"), ("qwen3_moe", 8, "none"), ("qwen3_moe", 2, "default")]
"""A Latin square over family x batch x policy: each family at both batch sizes and under both
policies, each policy at both batch sizes, in half the runs of the full grid."""
TIMEOUT_S = 600


def measure(out: Path, family: str, batch: int, policy: str) -> dict:
    """One run's row; {"error": ...} in it when the run failed (the test fails with it)."""
    argv = [
        f"--model.family={family}",
        f"--training.batch_size={batch}",
        "--training.seq_len=256",
        "--training.steps=2",  # step 2 is the first whose forward runs with AdamW's state
        "--device.type=cpu",
        "--metrics.rich=false",
        f"--metrics.output_dir={out / f'{family}-{batch}-{policy}'}",
        "--device.threads=1",  # two runs at once on a shared machine: spinning OpenMP threads would double the time
    ]
    if policy != "none":  # the captured step needs the static-shape experts
        argv += ["--graph_trainer.enable=true", f"--graph_trainer.memory_policy={policy}", "--kernels.moe=dense"]
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "MALLOC_MMAP_THRESHOLD_": "65536"}
    row = {"family": family, "batch": batch, "policy": policy}
    try:
        proc = subprocess.run([sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, env=env,
                              timeout=TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {**row, "error": f"no result within {TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {**row, "error": proc.stderr[-2000:]}
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**row, **got, "error_rel": got["estimate"] / got["measured"] - 1}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        rows = list(pool.map(lambda g: measure(out, *g), GRID))
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
