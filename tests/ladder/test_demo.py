"""`onboard demo`: the whole built ladder on the llama3 debugmodel, through the console script."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from onboard.ladder import default_specs

ONBOARD = Path(sys.executable).parent / "onboard"


@pytest.mark.slow
def test_demo_climbs_every_built_rung_and_prints_the_ladder(tmp_path):
    t0 = time.perf_counter()
    result = subprocess.run([ONBOARD, "demo", "--dir", tmp_path], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "demo ladder: llama3_debug" in out
    built = [spec.name for spec in default_specs() if spec.built]
    assert built[:3] == ["eager", "parity", "simple_fsdp"]
    for i, rung in enumerate(built, start=1):
        row = next(r for r in out.splitlines() if r.startswith(f"│ {i} │ {rung}"))
        assert "passed" in row, row
    assert "skipped" not in out
    assert f"ladder complete up to the last rung that exists: {built[-1]}" in out
    ws = tmp_path / "onboarding" / "llama3_debug"
    ledger = json.loads((ws / "ladder.json").read_text())
    assert [(e["rung"], e["status"]) for e in ledger["attempts"]] == [(r, "passed") for r in built]
    for rung in built:
        assert f"## {rung}: passed" in (ws / "REPORT.md").read_text()
    assert wall < 300, f"demo took {wall:.0f} s"
