"""`onboard demo`: the whole loop on a built-in debug model (llama3's by default, or FLUX's with
`--preset flux_debug`), end to end, in one command."""

from __future__ import annotations

import time
from pathlib import Path

from onboard.engine.ladder import RUNGS, default_specs, ladder_states, next_step
from onboard.report.write import WATERFALL, write_report_files
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.cli.views import ladder_table, show_outcome, status_dict
from onboard.workspace.layout import Workspace
from onboard.engine.ledger import Status
from onboard.rungs import harness
from onboard.errors import BadInput
from onboard.engine.gates import PRECISIONS
from onboard.engine.recipe_edit import apply_edits
from onboard.rungs.contract import RecipeEdit

NAME = "llama3_debug"
PRESET = "llama3/debugmodel"
PRESETS = {"llama3_debug": "llama3/debugmodel", "flux_debug": "flux/debugmodel"}
"""The demo's presets: workspace name -> the preset it is made from."""
TRAIN_PRESETS = ("llama3_debug",)
"""The presets the train stage runs for (a language model: an HF checkpoint, a tokenizer, text)."""
# Measured on the 2-core machine with other jobs running: 20 eager steps took 54 s with two
# threads and 14 s with one (spinning OpenMP threads fight over the cores); idle, one thread
# costs a second or two. The demo should take the same time wherever it runs.
THREADS_WHY = "one intra-op thread: steady on a small CPU shared with other work"


BF16 = [
    RecipeEdit("training.dtype", "bfloat16", "onboard demo --precision bf16: the model computes in bf16"),
    RecipeEdit("training.mixed_precision_param", "bfloat16", "onboard demo --precision bf16: parameters are bf16"),
]
"""The recipe edits of `--precision bf16`: a recipe that trains in bf16 from the start."""


def run_demo(base: Path, *, device: str, out, preset: str = NAME, timing: str = harness.SHIPPED,
             precision: str = "fp32", train: bool = True) -> dict:  # fmt: skip
    """new-model (replacing an earlier demo workspace), next-step until the ladder stops
    (complete up to the last built rung, or a failed gate), then status and report; then, for a
    language model whose ladder completed and unless `train` is off, the proved recipe trains a
    pretrained checkpoint on JSONL data (onboard/cli/demo_train.py).
    `preset`: a PRESETS name; `timing`: a harness.TIMING_PROFILES name; `precision`: fp32 | bf16,
    the recipe's precision at the start (BadInput for another)."""
    if preset not in PRESETS:
        raise BadInput(f"unknown demo preset '{preset}'; presets: {', '.join(PRESETS)}")
    if precision not in PRECISIONS:
        raise BadInput(f"unknown precision '{precision}'; precisions: {', '.join(PRECISIONS)}")
    if timing not in harness.TIMING_PROFILES:
        raise BadInput(f"unknown timing profile '{timing}'; profiles: {', '.join(harness.TIMING_PROFILES)}")
    if timing != harness.SHIPPED:
        out.log(f"demo: keep/choose decisions timed with the {timing} profile ({harness.TIMING_PROFILES[timing]})")
    with harness.timing_profile_of(timing):
        result = _climb(base, device=device, out=out, preset=preset, precision=precision)
    if not train or result["exit_code"] != 0:
        return result
    if preset not in TRAIN_PRESETS:
        out.log(f"demo: no train stage for {preset}: it shows a language model's checkpoint, tokenizer and text data")
        return result
    from onboard.cli.demo_train import run_train_stage  # lazy: the stage's modules load when it runs

    stage = run_train_stage(Workspace.load(base, preset), base, out=out)
    return {**result, "train": stage, "exit_code": stage["exit_code"]}


def _climb(base: Path, *, device: str, out, preset: str, precision: str) -> dict:
    name, source = preset, PRESETS[preset]
    t0 = time.perf_counter()
    plan = plan_workspace(name, base, preset=source, device=device, force=True, threads=(1, THREADS_WHY))
    root = write_workspace(plan, force=True)
    out.log(f"demo: created {root} from --preset {source}")
    if precision == "bf16":
        apply_edits(root / "recipe.toml", BF16)
        out.log("demo: the recipe trains in bf16 (training.dtype, mixed_precision_param)")
    ws = Workspace.load(base, name)
    specs = default_specs()
    steps = []
    # each call advances one rung or stops; a rung's recipe edit can send the ladder back to
    # re-verify the rungs that read the edited keys, so allow a few climbs before giving up
    for _ in range(3 * len(RUNGS)):
        outcome = next_step(ws, specs=specs, log=out.log, base_command=f"onboard next-step {name} --dir {base}")
        steps.append(outcome)
        if outcome.status != Status.COMPLETE:
            show_outcome(out.print, outcome)
        if outcome.status == Status.COMPLETE or outcome.exit_code != 0:
            break
    report = write_report_files(ws, specs)
    files = report.to_json()
    states = ladder_states(ws, specs)
    out.print(ladder_table(states, title=f"demo ladder: {name} ({source})"))
    last = steps[-1]
    wall = time.perf_counter() - t0
    out.print(
        f"{last.message}\nreport: {report.markdown}\nreport.html: {report.html}\n"
        f"waterfall: {report.where(WATERFALL)}\ndemo wall time: {wall:.1f} s"
    )
    return {
        "workspace": str(root),
        "steps": [s.to_json() for s in steps],
        "status": status_dict(ws, states),
        "report": files["report"],
        "html": files["html"],
        "waterfall": files["waterfall"],
        "pictures": files["pictures"],
        "wall_s": round(wall, 1),
        "exit_code": 0 if last.status == Status.COMPLETE else last.exit_code,
    }
