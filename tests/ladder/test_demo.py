"""`onboard demo`: the whole built ladder on the llama3 debugmodel, through the console script."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ONBOARD = Path(sys.executable).parent / "onboard"


@pytest.mark.slow
def test_demo_climbs_every_built_rung_and_prints_the_ladder(tmp_path):
    t0 = time.perf_counter()
    result = subprocess.run([ONBOARD, "demo", "--dir", tmp_path], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "demo ladder: llama3_debug" in out
    for line in ("│ 1 │ eager", "│ 2 │ parity"):
        row = next(r for r in out.splitlines() if r.startswith(line))
        assert "passed" in row, row
    assert "not built yet" in out and "skipped" not in out
    assert "ladder complete up to the last rung that exists: parity" in out
    ws = tmp_path / "onboarding" / "llama3_debug"
    ledger = json.loads((ws / "ladder.json").read_text())
    assert [(e["rung"], e["status"]) for e in ledger["attempts"]] == [("eager", "passed"), ("parity", "passed")]
    assert "## parity: passed" in (ws / "REPORT.md").read_text()
    assert wall < 300, f"demo took {wall:.0f} s"
