"""A port climbs the whole built ladder and hands over a recipe that reproduces its gates.

The Qwen2-MoE port of test_workspace_model.py (q/k/v bias, no QK-norm, a gated shared expert:
a model.py and adapter an agent would write) through `next_step` until the ladder is complete,
recipe edits and the re-verification they cause included; then `status` has every built rung
passed with its key numbers, the MoE model's compile and Graph Trainer evidence is what those
gates promise (no breaks with the static-shape experts, one graph per step, bit-identical),
and `onboard train` with the final recipe gives the step-1 loss the gates recorded.

The climb (port_climb.py) times its keep/choose decisions with the `quick` timing
profile (every entry says so): it proves the ladder's mechanics, and the demo climbs with the
shipped protocol. It runs in the background from the start of the session (tests/background.py)
and this test, among the last, asserts on what it left.

This is the ladder's one MoE climb; the llama3 debugmodel climbs it through `onboard demo` in
test_demo.py, and every native family's compile and capture are in tests/core/compile.
"""

from __future__ import annotations

import json
from pathlib import Path

import background
import pytest
from port_climb import STEPS_FILE
from test_demo import assert_train_reproduces_the_verified_step
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.ladder.table import default_specs
from onboard.ladder.states import ladder_states
from onboard.workspace.layout import Workspace
from ledger_paths import assert_every_named_path_exists

pytestmark = [pytest.mark.slow, pytest.mark.hf]


def test_a_port_climbs_the_ladder_and_its_recipe_reproduces_the_gates(tmp_path):
    run, done, wall = background.wait("port")
    assert done.returncode == 0, done.stderr
    beside = f" beside the rest of the suite (paused {run.paused_s:.0f} s)" if run.shared else ""
    print(f"the port's climb took {wall:.0f} s{beside}")
    base = run.base
    root = Path(done.stdout.strip().splitlines()[-1])
    assert root.parent == base / "onboarding"
    specs = default_specs()
    built = [s.name for s in specs if s.built]
    seen = []
    steps = [json.loads(line) for line in (base / STEPS_FILE).read_text().splitlines()]
    assert steps, done.stderr
    for out in steps:  # a rung's recipe edit may send the ladder round again
        if out["status"] == "complete":
            break
        if out["status"] not in ("passed", "not_applicable"):  # the whole story, not pytest's truncated repr
            print(json.dumps(out, indent=1, default=str))
        assert out["status"] in ("passed", "not_applicable"), (
            out["rung"],
            [c for c in out["criteria"] if not c["ok"]],
            out["error"],
        )
        seen.append(out["rung"])
    assert out["status"] == "complete" and sorted(set(seen), key=seen.index) == built
    # no flip: a climb reaches the top in at most twice as many next-step calls as there are rungs
    assert len(steps) <= 2 * len(built), [s["rung"] for s in steps]
    assert_every_named_path_exists(root)
    states = {s.rung: s for s in ladder_states(Workspace.load(base, root.name), specs)}
    assert {r: states[r].status for r in built} == {r: "passed" for r in built}

    ledger = json.loads((root / "ladder.json").read_text())
    attempts = ledger["attempts"]
    latest = {e["rung"]: e for e in attempts}
    assert {e["status"] for e in attempts} <= {"passed", "not_applicable"}
    timed = ("simple_fsdp", "graph_trainer", "kernels", "tuning")  # the rungs whose checklists time decisions
    profiles = {e["rung"]: e["details"].get("timing_profile") for e in attempts}
    assert profiles == {r: "quick" if r in timed else None for r in built}
    edits = [x["key"] for e in attempts for x in (e.get("recipe_edit") or {}).get("edits", [])]
    if any(k.startswith("kernels.") for k in edits):  # e.g. kernels.moe: the rungs that read it re-verified
        assert len(attempts) > len(built) and latest["eager"]["rerun_reason"]
    comp, graph = latest["compile"]["measurements"], latest["graph_trainer"]["measurements"]
    assert comp["graph_breaks"] == 0 and comp["moe_experts"] == "dense" and comp["step1_loss_rel_err"] <= 1e-5
    assert (graph["graphs_per_step"], graph["host_syncs"], graph["bit_identical"]) == (1, 0, True)
    status = CliRunner().invoke(app, ["status", root.name, "--dir", str(base)])
    assert status.exit_code == 0
    for shown in ("breaks 0", "graphs/step 1", "bit-identical true"):
        assert shown in status.stdout, status.stdout

    assert_train_reproduces_the_verified_step(root, ledger, tmp_path / "train")

    # the adapter defines the model every rung ran: an edit to it makes the whole ladder stale
    (root / "adapter.py").write_text((root / "adapter.py").read_text() + "\n# an agent's edit\n")
    states = {s.rung: s for s in ladder_states(Workspace.load(base, root.name), specs)}
    assert {r: states[r].status for r in built} == {r: "stale" for r in built}
    assert all("adapter.py" in states[r].reason for r in built), {r: states[r].reason for r in built}
