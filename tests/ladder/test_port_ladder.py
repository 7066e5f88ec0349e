"""A port climbs the whole built ladder and hands over a recipe that reproduces its gates.

The Qwen2-MoE port of test_workspace_model.py (q/k/v bias, no QK-norm, a gated shared expert:
a model.py and adapter an agent would write) through `next_step` until the ladder is complete,
recipe edits and the re-verification they cause included; then `status` has every built rung
passed and `onboard train` with the final recipe gives the step-1 loss the gates recorded.
"""

from __future__ import annotations

import json

import pytest
from test_demo import assert_train_reproduces_the_verified_step
from test_workspace_model import qwen2_moe_port

from onboard.ladder import default_specs, ladder_states, next_step
from onboard.workspace import Workspace

pytestmark = [pytest.mark.slow, pytest.mark.hf]


def test_a_port_climbs_the_ladder_and_its_recipe_reproduces_the_gates(tmp_path):
    root, _ = qwen2_moe_port(tmp_path)
    specs = default_specs()
    built = [s.name for s in specs if s.built]
    for _ in range(3 * len(built)):
        out = next_step(Workspace.load(tmp_path, root.name), specs=specs)
        if out.status == "complete":
            break
        if out.status not in ("passed", "not_applicable"):  # the whole story, not pytest's truncated repr
            print(json.dumps(out.to_json(), indent=1, default=str))
        assert out.status in ("passed", "not_applicable"), (out.rung, [c for c in out.criteria if not c["ok"]],
                                                              (out.entry or {}).get("error"))  # fmt: skip
    assert out.status == "complete"
    states = {s.rung: s for s in ladder_states(Workspace.load(tmp_path, root.name), specs)}
    assert {r: states[r].status for r in built} == {r: "passed" for r in built}

    assert_train_reproduces_the_verified_step(root, json.loads((root / "ladder.json").read_text()), tmp_path / "train")
