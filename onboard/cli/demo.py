"""`onboard demo`: the whole loop on a built-in debug model (llama3's by default, or FLUX's with
`--preset flux_debug`), end to end, in one command.

An earlier demo under the same --dir (its workspace `onboarding/<preset>/`, its train stage's
`demo/`) is a person's files like any other: the demo refuses to replace them without `--force`
(exit 2, before anything runs), and with it moves each aside to `<name>.backup-<time>` when it
replaces it, saying where. `make demo` passes `--force`, so running it again keeps the last run.
"""

from __future__ import annotations

import time
from pathlib import Path

from onboard.ladder.table import RUNGS, default_specs
from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.report.write import WATERFALL, write_report_files
from onboard.workspace.fsutil import BACKUP_INFIX, backup_aside
from onboard.workspace.scaffold import PRESET_NAMES, exists_refusal, plan_workspace, write_workspace
from onboard.cli.views import ladder_table, show_outcome, status_dict
from onboard.workspace.layout import Workspace, workspaces_dir
from onboard.workspace.ledger import Status
from onboard.ladder import contract
from onboard.rungs import timing_profiles
from onboard.errors import EXIT_FAILED, BadInput
from onboard.ladder.gates import PRECISIONS
from onboard.ladder.recipe_edit import apply_edits
from onboard.ladder.contract import RecipeEdit

NAME = "llama3_debug"
PRESETS = PRESET_NAMES
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


def run_demo(base: Path, *, device: str, out, preset: str = NAME, timing: str = contract.SHIPPED,
             precision: str = "fp32", train: bool = True, force: bool = False) -> dict:  # fmt: skip
    """new-model (an earlier demo's workspace replaced only with `force`, and kept as a backup), next-step
    until the ladder stops (complete up to the last built rung, or a failed gate), then status and report; then, for a
    language model whose ladder completed and unless `train` is off, the proved recipe trains a
    pretrained checkpoint on JSONL data (onboard/cli/demo_train.py).
    `preset`: a PRESETS name; `timing`: a timing_profiles.TIMING_PROFILES name; `precision`: fp32 | bf16,
    the recipe's precision at the start (BadInput for another)."""
    if preset not in PRESETS:
        raise BadInput(f"unknown demo preset '{preset}'; presets: {', '.join(PRESETS)}")
    if precision not in PRECISIONS:
        raise BadInput(f"unknown precision '{precision}'; precisions: {', '.join(PRECISIONS)}")
    if timing not in timing_profiles.TIMING_PROFILES:
        raise BadInput(f"unknown timing profile '{timing}'; profiles: {', '.join(timing_profiles.TIMING_PROFILES)}")
    stage_folder = _stage_folder(base) if train and preset in TRAIN_PRESETS else None
    if not force:  # refused before anything runs, not after minutes of climbing
        _refuse_replacing(workspaces_dir(base) / preset, stage_folder)
    if timing != contract.SHIPPED:
        out.log(f"demo: keep/choose decisions timed with the {timing} profile ({timing_profiles.TIMING_PROFILES[timing]})")
    result = _climb(base, device=device, out=out, preset=preset, precision=precision, force=force, timing=timing)
    if not train or result["exit_code"] != 0:
        return result
    if preset not in TRAIN_PRESETS:
        out.log(f"demo: no train stage for {preset}: it shows a language model's checkpoint, tokenizer and text data")
        return result
    from onboard.cli.demo_train import run_train_stage  # lazy: the stage's modules load when it runs

    stage_backup = None
    if stage_folder is not None and (stage_folder.exists() or stage_folder.is_symlink()):
        stage_backup = backup_aside(stage_folder)  # only with force: refused above otherwise
        out.print(f"demo: the earlier demo's training is kept as {stage_backup}", markup=False, soft_wrap=True)
    stage = run_train_stage(Workspace.load(base, preset), base, out=out)
    stage = {**stage, "backup": str(stage_backup) if stage_backup else None}
    return {**result, "train": stage, "exit_code": stage["exit_code"]}


def _stage_folder(base: Path) -> Path:
    from onboard.cli.demo_train import FOLDER  # lazy: as in run_demo

    return Path(base) / FOLDER


def _refuse_replacing(workspace: Path, stage_folder: Path | None) -> None:
    """BadInput naming the first of an earlier demo's folders this one would replace."""
    if workspace.exists():
        raise exists_refusal(workspace)
    if stage_folder is not None and (stage_folder.exists() or stage_folder.is_symlink()):
        raise BadInput(
            f"{stage_folder} (an earlier demo's training) already exists; pass --force to replace it (the old one is "
            f"then kept as {stage_folder.name}{BACKUP_INFIX}<time>)"
        )


def _climb(base: Path, *, device: str, out, preset: str, precision: str, force: bool = False,
           timing: str = contract.SHIPPED) -> dict:
    name, source = preset, PRESETS[preset]
    t0 = time.perf_counter()
    plan = plan_workspace(name, base, preset=source, device=device, force=force, threads=(1, THREADS_WHY))
    root = write_workspace(plan, force=force)
    out.log(f"demo: created {root} from --preset {source}")
    if plan.backup:
        out.print(f"demo: the earlier demo workspace is kept as {plan.backup}", markup=False, soft_wrap=True)
    if precision == "bf16":
        apply_edits(root / "recipe.toml", BF16)
        out.log("demo: the recipe trains in bf16 (training.dtype, mixed_precision_param)")
    backup = str(plan.backup) if plan.backup else None
    return {"workspace": str(root), "backup": backup, **_ladder(base, name, source, out=out, t0=t0, timing=timing)}


def _ladder(base: Path, name: str, source: str, *, out, t0: float, timing: str) -> dict:
    """next-step until the ladder stops, then the report and the ladder table (the demo's long part)."""
    ws = Workspace.load(base, name)
    specs = default_specs()
    steps = []
    # each call advances one rung or stops; a rung's recipe edit can send the ladder back to
    # re-verify the rungs that read the edited keys, so allow a few climbs before giving up
    for _ in range(3 * len(RUNGS)):
        outcome = next_step(ws, specs=specs, log=out.log, base_command=f"onboard next-step {name} --dir {base}",
                            timing_profile=timing)
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
    unfinished = last.status != Status.COMPLETE and last.exit_code == 0
    if unfinished:  # every call passed a rung, yet a lever kept sending the ladder back: not proved
        why = f"the ladder did not complete in {len(steps)} next-step calls (a kept lever kept changing)"
        last.message = f"{last.message}; {why}: see each rung's decisions in REPORT.md"
    out.print(
        f"{last.message}\nreport: {report.markdown}\nreport.html: {report.html}\n"
        f"waterfall: {report.where(WATERFALL)}\ndemo wall time: {wall:.1f} s"
    )
    return {
        "steps": [s.to_json() for s in steps],
        "status": status_dict(ws, states),
        "report": files["report"],
        "html": files["html"],
        "waterfall": files["waterfall"],
        "pictures": files["pictures"],
        "wall_s": round(wall, 1),
        "exit_code": EXIT_FAILED if unfinished else 0 if last.status == Status.COMPLETE else last.exit_code,
    }
