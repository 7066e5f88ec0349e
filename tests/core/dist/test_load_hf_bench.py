"""bench/load_hf.py run as a user runs it, on its tiniest shape: one JSON report whose loads read
exactly each rank's half of the checkpoint, with both ratios and the baseline it timed beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import hang_guard

ROOT = Path(__file__).resolve().parents[3]
pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.whole_machine, pytest.mark.hf]  # it times things: the climbs pause


def test_load_hf_bench_tiny():
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", HF_HUB_OFFLINE="1")
    args = ["--hidden", "256", "--layers", "2", "--vocab", "1000", "--mlp", "512", "--shard", "1MB", "--rounds", "2"]
    with hang_guard(300, "bench/load_hf.py") as guard:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "load_hf.py"), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=guard.timeout_s, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    model = report["checkpoint"]["model_bytes"]
    assert len(report["checkpoint"]["files"]) > 2  # sharded by max_shard_size
    assert [m["bytes_read"] for m in report["memory"]] == [model // 2, model // 2]
    assert [m["own_shard_bytes"] for m in report["memory"]] == [model // 2, model // 2]
    t = report["time"]
    assert len(t["check_and_load_s"]) == len(t["baseline_load_file_s"]) == 2
    assert t["time_ratio"] > 0 and all(m["rss_ratio"] > 0.5 for m in report["memory"])  # at least the own half
    assert isinstance(report["ok"], bool)
