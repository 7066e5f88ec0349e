"""`python bf16_climb.py BASE`: the climb test_bf16_ladder.py asserts on, run in the background
beside the rest of the suite (tests/background.py starts it at the session's start).

The demo model's architecture (llama3's debugmodel, narrowed: narrow.py) with a recipe that trains
in bf16, as `onboard demo --precision bf16` writes it (training.dtype and mixed_precision_param
bfloat16), so the simple_fsdp rung keeps bf16 parameters and compile, graph_trainer, kernels and
tuning run and are judged in bf16. Narrowed because bf16 matrix products on this CPU (no bf16
instructions) run over 100x slower than fp32's: the full debug model's bf16 climb takes many minutes
more than the suite has. Through `next_step` with the `quick` timing profile until the
ladder is complete or a step does not pass, over the rungs whose bounds depend on the precision
(PRECISION_RUNGS): parity and the kernels rung prove their kernels in fp32 whatever the recipe's
precision (DESIGN section 5), which the demo's and the port's climbs do; here they are left out of
the specs, as a rung not built is. Each step's outcome is a JSON line of BASE/climb.jsonl
(`StepOutcome.to_json`); the workspace's folder is the last line of stdout.
"""

from __future__ import annotations

import sys
from pathlib import Path

from narrow import narrow_workspace
from port_climb import STEPS_FILE, climb_workspace

from onboard.cli.demo import BF16
from onboard.ladder.recipe_edit import apply_edits
from onboard.ladder.table import RungSpec, default_specs

FP32_PROVED = ("parity", "kernels")
"""Rungs whose every bound is fp32's whatever the recipe trains in (checklists/parity.yaml, kernels.yaml)."""


def precision_specs() -> list[RungSpec]:
    """The ladder with FP32_PROVED's rungs not built: the climb passes over them."""
    return [RungSpec(s.name, None) if s.name in FP32_PROVED else s for s in default_specs()]


def climb(base: Path) -> Path:
    ws = narrow_workspace(base, "llama3", "bf16")
    apply_edits(ws.recipe_path, BF16)
    climb_workspace(base, ws.name, specs=precision_specs())
    return ws.root


if __name__ == "__main__":
    print(climb(Path(sys.argv[1])))
