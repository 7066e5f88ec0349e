"""A recipe that trains in bf16 climbs every rung whose bounds depend on the precision, each judged by
the bound of its own precision (parity and the kernels rung prove in fp32 whatever the recipe trains in:
bf16_climb.py passes over them; the demo's and the port's climbs climb them).

The demo model's architecture (llama3's debugmodel, narrowed: bf16_climb.py says why) with
training.dtype and mixed_precision_param bfloat16, as `onboard demo --precision bf16` writes it.
So the simple_fsdp rung keeps bf16 parameters (the recipe's own parameters are bf16), and compile,
graph_trainer, kernels and tuning run in bf16 and pass on bf16's bounds: where fp32's 1e-5 failed
the compiled step of such a recipe every time, and the uncompiled captured step is one bf16 ulp
from eager's. The climb runs in the background from the start of the session (tests/background.py)
and this test, among the last, asserts on what it left."""

from __future__ import annotations

import json
from pathlib import Path

import background
import pytest
from bf16_climb import FP32_PROVED, STEPS_FILE, precision_specs
from test_demo import assert_train_reproduces_the_verified_step

from ledger_paths import assert_every_named_path_exists

pytestmark = pytest.mark.slow

COMPARED = [("compile", "step1_loss"), ("graph_trainer", "exact_to_eager"), ("tuning", "final_step1_loss"),
            ("tuning", "final_step1_grad_norm")]  # fmt: skip
"""Every criterion that compares two runs of the recipe, with a bound per precision."""


def test_a_bf16_recipe_climbs_every_rung_judged_by_bf16s_bounds(tmp_path):
    run, done, wall = background.wait("bf16")
    assert done.returncode == 0, done.stderr
    print(f"the bf16 climb took {wall:.0f} s" + (" beside the rest of the suite" if run.shared else ""))
    root = Path(done.stdout.strip().splitlines()[-1])
    steps = [json.loads(line) for line in (run.base / STEPS_FILE).read_text().splitlines()]
    for out in steps:
        assert out["status"] in ("passed", "not_applicable", "complete"), (
            out["rung"], [c for c in out["criteria"] if not c["ok"]], out["error"],
        )  # fmt: skip
    assert steps[-1]["status"] == "complete"
    climbed = [s.name for s in precision_specs() if s.built]
    assert len(steps) <= 2 * len(climbed), [s["rung"] for s in steps]
    assert_every_named_path_exists(root)
    ledger = json.loads((root / "ladder.json").read_text())
    latest = {e["rung"]: e for e in ledger["attempts"]}
    eager = latest["eager"]["measurements"]
    assert eager["precision"] == "bf16" and eager["bf16_rounding"] > 0
    assert eager["bf16_rounding_bound"] == max(1e-5, 2 * eager["bf16_rounding"])
    sharded = latest["simple_fsdp"]["measurements"]
    assert sharded["mixed_precision_choice"] == "bfloat16" and "training.dtype" in sharded["mixed_precision_why"]
    assert set(latest) == set(climbed) and not set(latest) & set(FP32_PROVED), sorted(latest)
    for rung in climbed:
        m = latest[rung]["measurements"]
        assert m["runs_whole"] is True and m["runs_recorded"] >= 1 and m["runs_not_whole"] == [], rung
        if rung != "simple_fsdp":  # its runs are fp32 and bf16-params by design (checklists/simple_fsdp.yaml)
            assert m["precision"] == "bf16", rung
    for rung, name in COMPARED:
        c = next(c for c in latest[rung]["criteria"] if c["name"] == name)
        assert c["ok"] and c["precision"] == "bf16" and "bf16" in c["bound_why"], (rung, c)
        assert (c["threshold"], c["threshold_ref"]) == (eager["bf16_rounding_bound"], "evidence.eager.bf16_rounding_bound")
    assert_train_reproduces_the_verified_step(root, ledger, tmp_path / "train")
