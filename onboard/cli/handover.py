"""The commands around the ladder's result: `recipe` (what a workspace hands over and how to run
it), `plan` (the full model on a target) and `compat` (which transformers architectures the
transformers path runs). Registered on the app of onboard/cli/shared.py; onboard/cli/app.py imports this module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from onboard.cli.shared import DIR_OPTION, JSON_OPTION, Out, check_dir, run_command, app
from onboard.errors import EXIT_FAILED, EXIT_INTERRUPTED, BadInput
from onboard.sanitize import visible


@app.command("recipe")
def recipe_cmd(name: str = typer.Argument(...), dir: Path = DIR_OPTION, json_out: bool = JSON_OPTION):
    """Print the workspace's recipe, what each rung earned in it, and the commands that run it
    on one process, on this host and on many hosts (torchrun), and the one that continues training
    the model from its checkpoint on your data (with validation and an HF export)."""

    def body(out: Out) -> int:
        from onboard.cli.recipe_view import recipe_lines, recipe_view
        from onboard.workspace.layout import Workspace

        view = recipe_view(Workspace.load(check_dir(dir), name))
        if out.json:
            out.emit(view)
            return 0
        out.print(f"# {view['recipe']}", markup=False)
        out.print(view["text"].rstrip("\n"), markup=False, highlight=False)
        for line in recipe_lines(view):
            out.print(line, markup=False, soft_wrap=True)
        return 0

    run_command(json_out, body)


# ---- plan ------------------------------------------------------------------------------------
@app.command("plan")
def plan_cmd(
    name: str = typer.Argument(...),
    target: str = typer.Option(..., "--target", help="KIND[:COUNT]: v5e v5p v6e v7x h100 h200 b200 mi300x cpu."),
    seq: int = typer.Option(4096, "--seq", help="Tokens per sequence on the target."),
    efficiency: Optional[float] = typer.Option(
        None, "--efficiency", help="Fraction of the bf16 peak compiled FLOPs reach (default: calibrated per device)."
    ),
    check: bool = typer.Option(
        False, "--check", help="Then run the written recipe for 2 steps on the twin on this CPU: finite or not."
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace a plan recipe edited since plan wrote it, keeping it as <name>.backup-<time>."
    ),
    dir: Path = DIR_OPTION,
    json_out: bool = JSON_OPTION,
):
    """Plan the full model on a target: the mesh (dp_shard, dp_replicate, tp, ep, cp, pp) and why, memory
    per device, batch, memory policy, a predicted step time with its communication, the recipe's levers
    re-decided for the target; writes recipe.<kind>-<count>.seq<seq>.toml (one edited since plan wrote it
    only with --force) and prints the torchrun line. The --seq asked for is kept: exit 1 with one line saying
    what would fit when nothing does, or when --check finds the recipe does not run."""

    def body(out: Out) -> int:
        from onboard.sizing.plan.workspace import plan_lines, plan_result
        from onboard.workspace.layout import Workspace

        ws = Workspace.load(check_dir(dir), name)
        result = plan_result(ws, target, seq=seq, efficiency=efficiency, force=force)
        for warning in result["warnings"]:  # on stderr under --json too: the JSON holds them as well
            print(f"warning: {visible(warning)}", file=sys.stderr)
        if not result["recipe"]:  # nothing fits the --seq asked for: one line says what would, exit 1
            print(f"error: {visible(result['error'])}", file=sys.stderr)
            if out.json:
                out.emit(result)
            return EXIT_FAILED
        if check and result["recipe"]:
            from onboard.sizing.plan.check import check_plan_recipe

            out.log(f"checking {Path(result['recipe']).name} on this CPU ...")
            result["check"] = check_plan_recipe(ws, Path(result["recipe"]))
        if out.json:
            out.emit(result)
        else:
            for line in plan_lines(result):
                out.print(line, markup=False, soft_wrap=True)
        if not result["recipe"] or not result.get("check", {"ok": True})["ok"]:
            return EXIT_FAILED
        return 0

    run_command(json_out, body)


@app.command("compat")
def compat_cmd(
    model_types: Optional[list[str]] = typer.Argument(
        None, help="model_types to probe (default: every causal LM transformers ships)."
    ),
    types_opt: Optional[list[str]] = typer.Option(
        None, "--types", help="model_types to probe, comma-separated or repeated (added to the arguments)."
    ),
    markdown: Optional[Path] = typer.Option(
        None, "--markdown", help="Also write the table as Markdown to this file (after every architecture)."
    ),
    results: Optional[Path] = typer.Option(
        None, "--results", help="Also write the table as JSON to this file (after every architecture)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Keep the rows the --results file holds; probe only the others."
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing --results / --markdown file, keeping it as <name>.backup-<time>."
    ),
    timeout: float = typer.Option(
        900.0, "--timeout", help="Seconds one architecture's probe (its whole ladder) may take."
    ),
    jobs: int = typer.Option(
        1, "--jobs", help="Probes run side by side (each capped at cpu_count / jobs threads)."
    ),
    json_out: bool = JSON_OPTION,
):
    """Probe transformers architectures on the transformers path: every rung of the ladder, climbed
    with next-step on a workspace scaffolded from a tiny config; a table of what passes."""

    def body(out: Out) -> int:
        from onboard.compat import check_types, render_text, sweep_to_files

        named = [*(model_types or []), *(t for opt in types_opt or [] for t in opt.split(",") if t.strip())]
        if (model_types or types_opt) and not any(t.strip() for t in named):
            # names were given but none survived the split: that is no request for the hours-long full sweep
            given = [*(f"MODEL_TYPE {t!r}" for t in model_types or []), *(f"--types {t!r}" for t in types_opt or [])]
            raise BadInput(f"{', '.join(given)}: names no model_type (give one or more, e.g. --types llama,gpt2)")
        types = check_types([t.strip() for t in named]) if named else None
        # progress on stderr even under --json: a full sweep runs for hours
        result = sweep_to_files(
            types,
            timeout=timeout,
            markdown=markdown,
            results=results,
            resume=resume,
            jobs=jobs,
            log=_line_to_stderr,
            force=force,
        )
        if out.json:
            out.emit(result)
        else:
            sys.stdout.write(render_text(result))
            for key in ("backup", "markdown_backup"):
                if result[key]:
                    print(f"the file this sweep replaced is kept as {result[key]}")
        if result["interrupted"]:
            print(
                f"compat: interrupted; the tables hold the {len(result['rows']) + len(result['not_probed'])} "
                "model_types that finished",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        return 0

    run_command(json_out, body)


def _line_to_stderr(line: str) -> None:
    # one write per line: with --jobs, probes log from several threads, and print's separate
    # write of the newline would let their lines run together
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
