"""A port climbs the whole built ladder and hands over a recipe that reproduces its gates.

The Qwen2-MoE port of test_workspace_model.py (q/k/v bias, no QK-norm, a gated shared expert:
a model.py and adapter an agent would write) through `next_step` until the ladder is complete,
recipe edits and the re-verification they cause included; then `status` has every built rung
passed with its key numbers, the MoE model's compile and Graph Trainer evidence is what those
gates promise (no breaks with the static-shape experts, one graph per step, bit-identical),
and `onboard train` with the final recipe gives the step-1 loss the gates recorded.

This is the ladder's one MoE climb; the llama3 debugmodel climbs it through `onboard demo` in
test_demo.py, and every native family's compile and capture are in tests/core/compile.
"""

from __future__ import annotations

import json

import pytest
from test_demo import assert_train_reproduces_the_verified_step
from test_workspace_model import qwen2_moe_port
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.engine.ladder import default_specs, ladder_states, next_step
from onboard.workspace.layout import Workspace

pytestmark = [pytest.mark.slow, pytest.mark.hf]


def test_a_port_climbs_the_ladder_and_its_recipe_reproduces_the_gates(tmp_path):
    root, _ = qwen2_moe_port(tmp_path)
    # a batch near the tuning rung's CPU end (params.batch_max_tokens 2048 = 64 rows of 32), so its
    # search times one doubling, not four; every rung still runs the recipe as the user has it
    recipe = root / "recipe.toml"
    assert "batch_size = 4 " in recipe.read_text()
    recipe.write_text(recipe.read_text().replace("batch_size = 4 ", "batch_size = 32 ", 1))
    specs = default_specs()
    built = [s.name for s in specs if s.built]
    seen = []
    for _ in range(3 * len(built)):  # a rung's recipe edit may send the ladder round again
        out = next_step(Workspace.load(tmp_path, root.name), specs=specs)
        if out.status == "complete":
            break
        if out.status not in ("passed", "not_applicable"):  # the whole story, not pytest's truncated repr
            print(json.dumps(out.to_json(), indent=1, default=str))
        assert out.status in ("passed", "not_applicable"), (
            out.rung,
            [c for c in out.criteria if not c["ok"]],
            (out.entry or {}).get("error"),
        )
        seen.append(out.rung)
    assert out.status == "complete" and sorted(set(seen), key=seen.index) == built
    states = {s.rung: s for s in ladder_states(Workspace.load(tmp_path, root.name), specs)}
    assert {r: states[r].status for r in built} == {r: "passed" for r in built}

    ledger = json.loads((root / "ladder.json").read_text())
    attempts = ledger["attempts"]
    latest = {e["rung"]: e for e in attempts}
    assert {e["status"] for e in attempts} <= {"passed", "not_applicable"}
    edits = [x["key"] for e in attempts for x in (e.get("recipe_edit") or {}).get("edits", [])]
    if any(k.startswith("kernels.") for k in edits):  # e.g. kernels.moe: the rungs that read it re-verified
        assert len(attempts) > len(built) and latest["eager"]["rerun_reason"]
    comp, graph = latest["compile"]["measurements"], latest["graph_trainer"]["measurements"]
    assert comp["graph_breaks"] == 0 and comp["moe_experts"] == "dense" and comp["step1_loss_rel_err"] <= 1e-5
    assert (graph["graphs_per_step"], graph["host_syncs"], graph["bit_identical"]) == (1, 0, True)
    status = CliRunner().invoke(app, ["status", root.name, "--dir", str(tmp_path)])
    assert status.exit_code == 0
    for shown in ("breaks 0", "graphs/step 1", "bit-identical true"):
        assert shown in status.stdout, status.stdout

    assert_train_reproduces_the_verified_step(root, ledger, tmp_path / "train")

    # the adapter defines the model every rung ran: an edit to it makes the whole ladder stale
    (root / "adapter.py").write_text((root / "adapter.py").read_text() + "\n# an agent's edit\n")
    states = {s.rung: s for s in ladder_states(Workspace.load(tmp_path, root.name), specs)}
    assert {r: states[r].status for r in built} == {r: "stale" for r in built}
    assert all("adapter.py" in states[r].reason for r in built), {r: states[r].reason for r in built}
