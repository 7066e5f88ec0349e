"""`python bf16_climb.py BASE`: the climb test_bf16_ladder.py asserts on, run in the background
beside the rest of the suite (tests/background.py starts it at the session's start).

The demo model's architecture (llama3's debugmodel, narrowed: narrow.py) with a recipe that trains
in bf16, as `onboard demo --precision bf16` writes it (training.dtype and mixed_precision_param
bfloat16), so the simple_fsdp rung keeps bf16 parameters and compile, graph_trainer, kernels and
tuning run and are judged in bf16. Narrowed because bf16 matrix products on this CPU (no bf16
instructions) run over 100x slower than fp32's: the full debug model's bf16 climb takes many minutes
more than the suite has. Through `next_step` with the harness's `quick` timing profile until the
ladder is complete or a step does not pass. Each step's outcome is a JSON line of BASE/climb.jsonl
(`StepOutcome.to_json`); the workspace's folder is the last line of stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from narrow import narrow_workspace

from onboard.cli.demo import BF16
from onboard.engine.ladder import default_specs, next_step
from onboard.engine.recipe_edit import apply_edits
from onboard.rungs import harness
from onboard.workspace.layout import Workspace

STEPS_FILE = "climb.jsonl"
ACCEPTED = ("passed", "not_applicable")


def climb(base: Path) -> Path:
    ws = narrow_workspace(base, "llama3", "bf16")
    apply_edits(ws.recipe_path, BF16)
    specs = default_specs()
    built = [s for s in specs if s.built]
    with harness.timing_profile_of("quick"), (base / STEPS_FILE).open("w") as steps:
        for _ in range(3 * len(built)):
            out = next_step(Workspace.load(base, ws.name), specs=specs)
            steps.write(json.dumps(out.to_json(), default=str) + "\n")
            steps.flush()
            if str(out.status) not in ACCEPTED:  # complete, or a step that did not pass
                break
    return ws.root


if __name__ == "__main__":
    print(climb(Path(sys.argv[1])))
