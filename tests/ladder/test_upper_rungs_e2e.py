"""The whole built ladder through the CLI on a narrowed qwen3_moe debug workspace: the MoE
model climbs eager -> parity -> simple_fsdp -> compile -> graph_trainer -> ... with real runs,
each rung's evidence recorded, and the status table showing the key numbers. (The llama3
debugmodel climbs the same ladder at full width in test_demo.py.)"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from onboard.cli import app
from onboard.ladder import default_specs

pytestmark = [pytest.mark.slow, pytest.mark.hf]
runner = CliRunner()


def onboard(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_qwen3_moe_climbs_every_built_rung(narrow_ws, tmp_path):
    ws = narrow_ws("qwen3_moe", "moe")
    built = [s.name for s in default_specs() if s.built]
    seen = []
    for _ in range(3 * len(built)):  # a rung's recipe edit may send the ladder round again
        res = onboard("next-step", "moe", "--dir", tmp_path, "--json")
        out = json.loads(res.stdout)
        if out["status"] == "complete":
            break
        assert res.exit_code == 0 and out["status"] in ("passed", "not_applicable"), (
            out.get("rung"), out.get("failed"), out.get("hints"), out.get("error"))  # fmt: skip
        seen.append(out["rung"])
    assert out["status"] == "complete" and sorted(set(seen), key=seen.index) == built
    ledger = json.loads((ws.root / "ladder.json").read_text())["attempts"]
    by_rung = {e["rung"]: e for e in ledger}  # the latest attempt of each
    assert {e["status"] for e in ledger} <= {"passed", "not_applicable"}
    edits = [x["key"] for e in ledger for x in (e.get("recipe_edit") or {}).get("edits", [])]
    if any(not k.endswith(".enable") for k in edits):  # e.g. kernels.moe: the rungs that read it re-verified
        assert len(ledger) > len(built) and by_rung["eager"]["rerun_reason"]
    comp, graph = by_rung["compile"]["measurements"], by_rung["graph_trainer"]["measurements"]
    assert comp["graph_breaks"] == 0 and comp["moe_experts"] == "dense" and comp["step1_loss_rel_err"] <= 1e-5
    assert (graph["graphs_per_step"], graph["host_syncs"], graph["bit_identical"]) == (1, 0, True)
    status = onboard("status", "moe", "--dir", tmp_path)
    assert status.exit_code == 0
    assert "breaks 0" in status.stdout and "graphs/step 1" in status.stdout and "bit-identical true" in status.stdout
