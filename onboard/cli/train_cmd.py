"""`onboard train NAME [--steps N]` or `onboard train --config RECIPE`, each with [--nproc N] [--json]
[--section.key=value ...]: train with a workspace's recipe (onboarding/NAME/recipe.toml, whose
model.hf_config is the workspace's config) or any recipe, as `python -m titan_core.train` does, first
saying how large the model is. `--steps N` is `--training.steps=N`.

Before the first step it prints the model's parameters, in total and active per token (a MoE
model's token uses top_k of its routed experts), counted by titan_core's `count_params` on the
recipe's model built on meta. With --json, stdout is one JSON document (`train_result`: the exit
code, steps run, the final loss, the parameter counts, the run folder) and the run is silent; its
errors still go to stderr. One process trains in this one; --nproc N > 1 goes through titan_core's
launcher, which echoes rank 0 on stderr, and the JSON then reads the run's metrics.jsonl.
Registered on the app of onboard/cli/shared.py; onboard/cli/app.py imports this module.
"""

from __future__ import annotations

import math
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Optional

import typer

from onboard.cli.shared import DIR_OPTION, JSON_OPTION, Out, app, check_dir, run_command
from onboard.errors import BadInput


def param_counts(cfg) -> dict[str, int]:
    """{params_total, params_active} of the recipe's model, built on meta (no memory, seconds at 70B)."""
    from titan_core.models.common.param_counts import count_params  # lazy: torch loads when a run starts
    from titan_core.models.model_builder import build_model_from_config  # lazy: as above

    counts = count_params(build_model_from_config(cfg.model)[2])
    return {"params_total": counts.total, "params_active": counts.active}


def counts_line(counts: dict[str, int]) -> str:
    total, active = counts["params_total"], counts["params_active"]
    if active == total:
        return f"parameters: {total:,} (every one active per token)"
    return f"parameters: {total:,} in total, {active:,} active per token ({active / total:.1%})"


def _final_loss(rows: list[dict]) -> dict:
    """The last row's loss: a float, or None with its repr when it is not finite (strict JSON)."""
    if not rows:
        return {"final_loss": None}
    loss = rows[-1].get("loss")
    if isinstance(loss, float) and math.isfinite(loss):
        return {"final_loss": loss}
    return {"final_loss": None, "final_loss_repr": rows[-1].get("loss_repr", repr(loss))}


def train_result(cfg, argv: list[str], nproc: int) -> dict:
    """Train (silently: stdout stays the JSON's) and say how it went; ConfigError for bad input."""
    from titan_core.measure.metrics import file_stamp, read_metrics  # lazy: torch loads when a run starts

    counts = param_counts(cfg)
    run_dir = Path(cfg.metrics.output_dir).resolve()
    metrics = run_dir / "metrics.jsonl"
    result = {"exit_code": 0, "nproc": nproc, "run": str(run_dir), "metrics_file": str(metrics), **counts,
              "steps_planned": cfg.training.steps}  # fmt: skip
    if nproc == 1:
        from titan_core.train import run  # lazy: torch loads when a run starts

        with redirect_stdout(sys.stderr):  # a stray print of the run must not break the JSON
            trained = run(cfg, quiet=True)
        rows = trained.metrics
        result.update(steps_run=len(rows), resumed_from=trained.resumed_from, stopped=trained.stopped)
        if trained.stopped:
            print(f"error: {trained.stopped}", file=sys.stderr)
            result["exit_code"] = 1
    else:
        from titan_core.launcher import launch  # lazy: as above

        before = file_stamp(metrics)
        result["exit_code"] = launch(argv, nproc)
        # a run that logged nothing leaves an earlier run's file as it was: none of its rows are this run's
        rows = read_metrics(metrics) if file_stamp(metrics) not in (None, before) else []
        # a resumed run's file starts with the rows before its checkpoint, which the ranks do not report
        resumable = cfg.checkpoint.enable and cfg.checkpoint.resume
        result.update(steps_run=None if resumable else len(rows), resumed_from=None, stopped=None)
    result.update(last_step=rows[-1]["step"] if rows else None, **_final_loss(rows))
    return result


def _json_run(out: Out, argv: list[str], nproc: int) -> int:
    from titan_core.config.loader import load_config  # lazy: the CLI starts without torch
    from titan_core.runtime.argv import parse_argv  # lazy: as above

    config, print_config, overrides = parse_argv(argv)
    if print_config:
        raise BadInput("--print-config prints the recipe as TOML, not JSON: leave out one of them")
    result = train_result(load_config(config, overrides), argv, nproc)
    out.emit(result)
    return result["exit_code"]


def _text_counts(argv: list[str]) -> None:
    """Print the parameter counts before training; nothing where the recipe is bad input, which
    the trainer then reports as it always has, or where only the recipe is printed."""
    from titan_core.config.loader import ConfigError, load_config  # lazy: the CLI starts without torch
    from titan_core.runtime.argv import parse_argv  # lazy: as above

    try:
        config, print_config, overrides = parse_argv(argv)
        if print_config:
            return
        counts = param_counts(load_config(config, overrides))
    except ConfigError:
        return
    print(counts_line(counts), flush=True)


def train_argv(extra: list[str], config: Path | None, steps: int | None, base: Path) -> list[str]:
    """titan_core's argv for `onboard train`: the recipe (--config, or the workspace NAME that comes
    first among the extra arguments), `--steps` as training.steps, then the overrides as given."""
    # NAME is not a typer argument: with unknown options allowed, click would hand it the first
    # override (`--training.steps` of `--training.steps 5`). An override's value follows its key,
    # so a workspace name can only be the first extra argument.
    name = extra[0] if extra and not extra[0].startswith("-") else None
    overrides = extra[1:] if name is not None else list(extra)
    if name is not None and config is not None:
        raise BadInput(f"give a workspace NAME ({name}) or --config {config}, not both")
    if name is None and config is None:
        raise BadInput("name what to train: onboard train NAME (a workspace) or onboard train --config RECIPE")
    if steps is not None:
        if steps < 1:
            raise BadInput(f"--steps must be at least 1, got {steps}")
        if any(a == "--training.steps" or a.startswith("--training.steps=") for a in overrides):
            raise BadInput("--steps and --training.steps both set the steps: give one of them")
        overrides.append(f"--training.steps={steps}")
    if name is not None:
        from onboard.workspace.layout import Workspace  # lazy: as the other commands, inside the command

        config = Workspace.load(check_dir(base), name).recipe_path  # BadInput naming the workspaces there
    # the recipe's relative paths: titan_core's loader anchors them to the recipe's folder
    return ["--config", str(config), *overrides]


@app.command(
    "train",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="[NAME] [OPTIONS] [--section.key=value ...]",
)
def train_cmd(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(None, "--config", help="Recipe TOML (instead of a workspace NAME)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Steps to train: training.steps of the recipe."),
    nproc: int = typer.Option(1, "--nproc", help="Local processes (ranks) to start; >1 goes through the launcher."),
    dir: Path = DIR_OPTION,
    json_out: bool = JSON_OPTION,
):
    """Train a workspace's recipe (onboard train NAME [--steps N]) or any recipe (onboard train --config
    RECIPE), like `python -m titan_core.train --config RECIPE [--a.b=c ...]`; prints the model's
    parameters (total, active per token) first."""

    def body(out: Out) -> int:
        argv = train_argv(list(ctx.args), config, steps, dir)
        if nproc < 1:
            raise BadInput(f"--nproc must be at least 1, got {nproc}")
        if out.json:
            return _json_run(out, argv, nproc)
        # titan_core reports its own config errors; run_command makes an OS error one line, and SIGTERM
        # unwind like Ctrl-C (the launcher stops its ranks, a checkpoint write finishes its cleanup)
        _text_counts(argv)
        if nproc > 1:
            from titan_core.launcher import launch  # lazy: torch loads when a run starts

            return launch(argv, nproc)
        from titan_core.train import main as train_main  # lazy: as above

        return train_main(argv)

    run_command(json_out, body)
