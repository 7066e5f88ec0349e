"""The CPU's matmul peak, the denominator of CPU MFU: the best rate seen on this machine.

A probe in one process on a shared machine measures whatever share of the cores it got:
the same model once read MFU 34.7% and 91.4% in two runs in a row, because each run
probed its own peak. So a probe here takes the best of several timed rounds, and the best
probe ever seen for this CPU, thread count, dtype and torch version is kept on disk
(`$TITAN_CORE_CACHE_DIR`, default `~/.cache/titan_core`, file `cpu_peak.json`, written
atomically) with the date and the machine's load when it was taken. A loaded probe can
never lower it, so after one quiet probe every run divides by the same number. Once a peak is kept,
a process checks it with one short round (SPOT_CHECK): it can still raise the kept peak at a quiet
moment, and a training process, every rank of a launch included, no longer spends a second of CPU
(1.24 CPU-s on the 2-core machine, against 0.12) re-measuring a number it already has.

CPU MFU stays indicative: the peak is a measured matmul rate, not a datasheet figure.
"""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import torch

from titan_core.runtime import cpu_bf16
from titan_core.runtime.cpu_load import load_1m
from titan_core.runtime.files import atomic_write_text

N = 1024
"""Largest matmul size of the probe: compute-bound on a CPU, ~10 ms in fp32 here."""
MIN_N = 128
PRODUCT_S = 0.01
"""The probe's products grow from MIN_N until one takes this long (or N is reached): a dtype the CPU
has no instructions for (bf16 in torch's own kernel here ran ~100x slower than fp32) is probed at a size that still
takes ~10 ms a product, not ~10 s (a fixed 1024 made every bf16 run's first step wait minutes)."""


def cache_path() -> Path:
    root = os.environ.get("TITAN_CORE_CACHE_DIR") or Path.home() / ".cache" / "titan_core"
    return Path(root) / "cpu_peak.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(dtype: torch.dtype) -> str:
    return f"{_cpu_model()} | threads={torch.get_num_threads()} | {dtype} | torch {torch.__version__}"


def probe_operands(dtype: torch.dtype) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(n, a, b): the probe's n x n operands, n doubled from MIN_N until one product takes PRODUCT_S or n is N."""
    if dtype == torch.bfloat16:
        cpu_bf16.enable()  # the rate a bf16 run's products get here (runtime/cpu_bf16.py)
    n = MIN_N
    while True:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        t0 = time.perf_counter()
        a @ b  # warm-up (thread pool, allocator), and the size's cost
        if n >= N or time.perf_counter() - t0 >= PRODUCT_S:
            return n, a, b
        n *= 2


SPOT_CHECK = {"rounds": 1, "trials": 2}
"""The probe of a process that finds a peak kept for its key."""


def probe(dtype: torch.dtype = torch.float32, *, rounds: int = 5, trials: int = 8) -> float:
    """Best matmul FLOP/s over `rounds` rounds of `trials` timed products (each round after a pause)."""
    n, a, b = probe_operands(dtype)
    best = float("inf")
    for r in range(rounds):
        if r:
            time.sleep(0.02)  # let a neighbour's burst pass: rounds sample different moments
        for _ in range(trials):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def _read() -> dict:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(data: dict) -> None:
    try:
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache_path(), json.dumps(data, indent=2))
    except OSError:
        pass  # a read-only home: the peak is this process's own probe, still the best of its rounds


@lru_cache(maxsize=None)
def measured_cpu_peak(dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s to divide CPU MFU by: max(this process's probe, the best probe kept for this machine); a full
    probe when none is kept, SPOT_CHECK's short one when one is."""
    key = cache_key(dtype)
    data = _read()
    kept = data.get(key) if isinstance(data.get(key), dict) else None
    if not (kept and isinstance(kept.get("flops"), (int, float))):
        kept = None
    rate = probe(dtype, **SPOT_CHECK) if kept else probe(dtype)
    if kept and kept["flops"] >= rate:
        return float(kept["flops"])
    data[key] = {
        "flops": rate,
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_1min": load_1m(),
    }
    _write(data)
    return rate
