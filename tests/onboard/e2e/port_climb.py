"""`python port_climb.py BASE`: the climb test_port_ladder.py asserts on, run in the background
beside the rest of the suite (tests/background.py starts it at the session's start).

The Qwen2-MoE port of test_workspace_model.py under BASE, compiling with aot_eager (AOT_EAGER), its
batch raised near the tuning rung's CPU end (params.batch_max_tokens 2048 = 64 rows of 32: its search then times one
doubling, not four; every rung still runs the recipe as the user has it), through `next_step`
with the `quick` timing profile until the ladder is complete or a step does not pass:
a rung's recipe edit may send the ladder round again. Each step's outcome is a JSON line of
BASE/climb.jsonl (`StepOutcome.to_json`), written as it ends; the workspace's folder is the
last line of stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from test_workspace_model import qwen2_moe_port

from onboard.ladder.table import default_specs
from onboard.engine.next_step import next_step

from onboard.workspace.layout import Workspace

STEPS_FILE = "climb.jsonl"
AOT_EAGER = '\n[compile]\nbackend = "aot_eager"  # the suite\'s port: inductor\'s builds are the demo\'s climb\'s\n'
"""The port compiles with aot_eager: every rung that compiles (compile, graph_trainer's modes, each kernels
candidate in the recipe's mode, tuning) runs the same logic as under inductor, without a C++ build per graph
(the kernels rung in compile mode built one per candidate: 71 of the climb's 223 s alone). The demo's climb
(test_demo.py) and tests/core/compile compile with inductor."""
ACCEPTED = ("passed", "not_applicable")


def climb(base: Path) -> Path:
    root, _ = qwen2_moe_port(base)
    recipe = root / "recipe.toml"
    if "batch_size = 4 " not in recipe.read_text():
        raise SystemExit(f"the port's recipe has no 'batch_size = 4 ' to raise any more: {recipe}")
    recipe.write_text(recipe.read_text().replace("batch_size = 4 ", "batch_size = 32 ", 1) + AOT_EAGER)
    climb_workspace(base, root.name)
    return root


def climb_workspace(base: Path, name: str, specs=None) -> None:
    """`next_step` with the quick timing profile until the ladder is complete or a step does not pass,
    each outcome a JSON line of BASE/climb.jsonl (the background climbs' shared loop); `specs`: the
    rungs to climb (default: every built one)."""
    specs = specs or default_specs()
    built = [s for s in specs if s.built]
    with (base / STEPS_FILE).open("w") as steps:
        for _ in range(3 * len(built)):
            out = next_step(Workspace.load(base, name), specs=specs, timing_profile="quick")
            steps.write(json.dumps(out.to_json(), default=str) + "\n")
            steps.flush()
            if str(out.status) not in ACCEPTED:  # complete, or a step that did not pass
                break


if __name__ == "__main__":
    print(climb(Path(sys.argv[1])))
