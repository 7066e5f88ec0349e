"""`bench/plan_vs_published.py`: the plan's predictions beside published runs, each within 0.7-1.3 of
its figure, and the time model's constants the ones the published rows give.

The bench runs as a user runs it (a subprocess printing one JSON document); everything is on meta,
a few seconds. The calibrating rows meet their figures by construction (within rounding of the
constants); the held-out Qwen3-235B-A22B row is the test of expert parallelism and communication.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.sizing.plan_published import PUBLISHED, constants_in_use, derive_constants
from onboard.sizing.plan_search import CLOSE

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def report() -> dict:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "plan_vs_published.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_prediction_is_within_0_7_to_1_3_of_its_published_figure(report):
    rows = {r["id"]: r for r in report["rows"]}
    assert set(rows) == {p.id for p in PUBLISHED} and report["band"] == [0.7, 1.3] and report["all_within_band"]
    for r in rows.values():
        published = r["published_tokens_per_s_device"] or r["published_mfu"]
        got = r["predicted_tokens_per_s_device"] if r["published_tokens_per_s_device"] else r["predicted_mfu"]
        assert r["ratio"] == pytest.approx(got / published) and 0.7 <= r["ratio"] <= 1.3, r
        assert r["fits_memory_model"], r  # the published layout and batch fit the memory model too
    # TorchTitan's three 8B runs, as published: 5,762 / 6,667 / 8,532 tokens/s per GPU
    tt = [rows[f"torchtitan-llama3.1-8b-{k}"] for k in ("eager", "compile", "float8")]
    assert [r["published_tokens_per_s_device"] for r in tt] == [5762, 6667, 8532]
    assert tt[0]["predicted_tokens_per_s_device"] < tt[1]["predicted_tokens_per_s_device"] < tt[2][
        "predicted_tokens_per_s_device"]  # fmt: skip
    # the seed's MoE on 1,024 chips: the held-out row, planned with expert parallelism
    moe = rows["seed-qwen3-235b-a22b"]
    assert moe["calibrates"] is None and moe["published_mfu"] == 0.324 and " x EP " in moe["layout"]
    assert rows["seed-qwen3-8b"]["published_mfu"] == 0.515
    # the plan's choice margin is no tighter than the model's largest error on the table
    assert report["largest_error"] <= CLOSE == report["choice_margin"]
    assert {h["kind"] for h in report["hardware"]} >= {"v5e", "v5p", "v6e", "v7x", "h100", "h200", "b200"}
    assert all(h["source"] for h in report["hardware"])


def test_the_constants_are_the_ones_the_published_rows_give():
    derived, used = derive_constants(), constants_in_use()
    assert set(derived) == set(used) == {p.calibrates for p in PUBLISHED if p.calibrates}
    for name, value in used.items():
        assert value == pytest.approx(derived[name], rel=0.02), name
