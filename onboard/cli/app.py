"""The `onboard` command line: new-model, next-step, status, list, report, waive, demo, skill (recipe, plan
and compat: handover.py; export: export_cmd.py; train: train_cmd.py), all on the app of shared.py, whose
`run_command` is every command's one error boundary: --json, the exit codes and one-line errors of
DESIGN section 4 (`onboard.errors.describe_os_error` for an OS error).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.panel import Panel

from onboard.cli.shared import DIR_OPTION, JSON_OPTION, Out, check_dir, run_command, app, skill_app
from onboard.errors import BadInput, describe_os_error
from onboard.sanitize import markup_safe, visible


# ---- new-model -----------------------------------------------------------------------------
@app.command("new-model")
def new_model(
    name: str = typer.Argument(..., help="Workspace name: letters, digits and '_' (an identifier)."),
    hf_config: Optional[Path] = typer.Option(None, "--hf-config", help="HF config.json (or its folder)."),
    preset: Optional[str] = typer.Option(
        None, "--preset", help="FAMILY[/FLAVOR] of titan_core, e.g. llama3/debugmodel."
    ),
    weights: Optional[Path] = typer.Option(
        None, "--weights", help="Folder of HF safetensors: parity's weights and the recipe's checkpoint.initial_hf."
    ),
    path: Optional[str] = typer.Option(
        None,
        "--path",
        help="native (a titan_core family runs it; the default) | port (model.py from the closest family) | "
        "transformers (transformers' own class, run by titan_core).",
    ),
    dir: Path = DIR_OPTION,
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | tpu."),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing workspace of that name, keeping it as NAME.backup-<time>."
    ),
    twin: Optional[bool] = typer.Option(
        None, "--twin/--no-twin", help="Gates on a smaller twin of the model (default: when the full one does not fit)."
    ),
    twin_layers: Optional[int] = typer.Option(
        None, "--twin-layers", help="Layers of the twin (at least one full period of the layer pattern)."
    ),
    twin_width: Optional[int] = typer.Option(None, "--twin-width", help="hidden_size of the twin."),
    json_out: bool = JSON_OPTION,
):
    """Scaffold onboarding/NAME/ from an HF config or a titan_core preset."""

    def body(out: Out) -> int:
        from onboard.workspace.scaffold import plan_workspace, write_workspace
        from onboard.sizing.twin.setup import apply_twin

        def not_causal_reason(cfg):  # the transformers path's probe; compat loads only when it is asked
            from onboard.compat.causal import not_causal_reason

            return not_causal_reason(cfg)

        check_dir(dir)
        plan = plan_workspace(
            name, dir, hf_config=hf_config, preset=preset, weights=weights, path=path, device=device, force=force,
            not_causal=not_causal_reason,
        )
        mode = "auto" if twin is None else "on" if twin else "off"
        choice = apply_twin(plan, mode=mode, layers=twin_layers, width=twin_width)
        root = write_workspace(plan, force=force)
        from onboard.sizing.fit import fit_warning

        warning = None
        if choice.twin is None and (choice.full_fit is None or not choice.full_fit.fits):
            warning = fit_warning(plan.hf_config, plan.family, recipe_text=plan.files["recipe.toml"])
        files = sorted(plan.files) + ["ladder.json"]
        result = {
            "workspace": str(root),
            "name": name,
            "family": plan.family,
            "path": plan.path_kind,
            "model_type": plan.model_type,
            "files": files,
            "unconsumed_keys": plan.unconsumed,
            "todos": plan.todos,
            "architecture_differences": plan.arch_differences,
            "upstream_tensors": plan.upstream_tensors,
            "architecture_note": plan.arch_note,
            "warnings": [warning] if warning else [],
            "twin": (
                {"file": "twin.json", **{k: plan.twin[k] for k in ("summary", "reason", "rows")}} if plan.twin else None
            ),
            "twin_decision": choice.reason,
            "backup": str(plan.backup) if plan.backup else None,
            "next": f"onboard next-step {name}" + ("" if Path(dir) == Path(".") else f" --dir {dir}"),
        }
        if out.json:
            out.emit(result)
            return 0
        out.print(
            f"[bold green]created[/] {markup_safe(root)}  ({plan.path_kind} path, family {plan.family}, "
            f"model_type {markup_safe(plan.model_type)})"
        )
        out.print("files: " + ", ".join(files))
        if plan.backup:
            out.print(f"the workspace it replaced is kept as {plan.backup}", markup=False, soft_wrap=True)
        if warning:
            out.print(f"[bold yellow]warning:[/] {markup_safe(warning)}", soft_wrap=True)
        if choice.twin is not None:
            from onboard.sizing.twin.setup import twin_table

            reason = markup_safe(choice.reason)
            out.print(f"[bold]the gates run on a twin[/] (twin.json), because {reason}", soft_wrap=True)
            out.print(twin_table(choice.twin))
        if plan.unconsumed:
            out.print(
                f"[bold yellow]config keys the {plan.family} family does not consume[/] (handle each or confirm it is irrelevant):"
            )
            for key in plan.unconsumed:
                # the key as the config spells it, made visible; json.dumps escapes the value's own
                out.print(f"  {visible(key)} = {json.dumps(plan.hf_config[key])}", markup=False)
        else:
            out.print(f"every architecture key of config.json is consumed by the {plan.family} family")
        if plan.arch_differences:
            out.print(f"[bold yellow]architecture differences from the {plan.family} family the keys cannot show:[/]")
            for diff in plan.arch_differences:
                out.print(f"  {diff}", markup=False)
        elif plan.arch_note:
            out.print(plan.arch_note, markup=False)
        elif plan.path_kind == "port":
            out.print(f"no architecture differences from the {plan.family} family in the upstream modules")
        if plan.path_kind == "port":
            out.print(f"{len(plan.todos)} TODO(port) items in model.py")
        out.print(f"next: [bold]{markup_safe(result['next'])}[/]")
        return 0

    run_command(json_out, body)


# ---- next-step -----------------------------------------------------------------------------
@app.command("next-step")
def next_step_cmd(
    name: str = typer.Argument(...),
    dir: Path = DIR_OPTION,
    json_out: bool = JSON_OPTION,
    timing: str = typer.Option("shipped", "--timing", hidden=True, help="Timing profile of keep/choose decisions."),
):
    """Run the current rung's gate; record the evidence; exit 0 passed, 1 failed, 2 bad input."""

    def body(out: Out) -> int:
        from onboard.engine.next_step import next_step
        from onboard.cli.views import show_outcome
        from onboard.rungs.timing_profiles import TIMING_PROFILES
        from onboard.workspace.layout import Workspace

        if timing not in TIMING_PROFILES:  # tests and compat time with "quick"; the attempt records it
            raise BadInput(f"--timing: unknown timing profile '{timing}'; profiles: {', '.join(TIMING_PROFILES)}")
        ws = Workspace.load(check_dir(dir), name)
        command = f"onboard next-step {name}" + ("" if Path(dir) == Path(".") else f" --dir {dir}")
        outcome = next_step(ws, log=out.log, base_command=command, timing_profile=timing)
        if outcome.os_error:  # the machine failed, not the gate: one line, like any other OS error
            print(f"error: {visible(outcome.message)}", file=sys.stderr)
        if out.json:
            out.emit(outcome.to_json())
        elif not outcome.os_error:
            show_outcome(out.print, outcome)
        return outcome.exit_code

    run_command(json_out, body)


# ---- status / list / report ------------------------------------------------------------------
def _print_status(out: Out, ws, states) -> None:
    from onboard.cli.views import ladder_message, ladder_table
    from onboard.ladder.evidence import workspace_facts

    meta = ws.ledger.meta
    facts, mismatches = workspace_facts(ws)  # the workspace's files, not ladder.json's word
    out.print(
        ladder_table(
            states,
            title=markup_safe(f"{ws.name}: {facts['model_type']} ({meta.get('path')} path, family {facts['family']}, "
                              f"device {ws.device})"),  # config strings
        )
    )
    for line in mismatches:
        out.print(markup_safe(line), style="yellow")
    waivers = list(ws.ledger.waivers().values())
    if waivers:
        lines = "\n".join(  # the reasons are a person's text, shown as written (no markup)
            markup_safe(f"{w['rung']}/{w['criterion']}: {w['why']}  ({w.get('by')}, {w['time'][:19]})"
                        + _ignored_waiver(w['rung'], w['criterion']))
            for w in waivers
        )
        out.print(Panel(lines, title="WAIVED CRITERIA", border_style="bold red", style="red"))
    out.print(ladder_message(states))


def _ignored_waiver(rung: str, criterion: str) -> str:
    """"  IGNORED: <why>" for a waiver on record that no reader honours (finiteness, every run whole)."""
    from onboard.ladder.gates import ChecklistError, load_checklist  # lazy: status of a plain ladder reads no checklist

    try:
        found = load_checklist(rung).criterion(criterion)
    except ChecklistError:
        return ""
    return f"  IGNORED: {found.unwaivable_why()}" if found is not None and not found.waivable else ""


@app.command("status")
def status_cmd(name: str = typer.Argument(...), dir: Path = DIR_OPTION, json_out: bool = JSON_OPTION):
    """The ladder table of one workspace: each rung's status, stale rungs and waivers."""

    def body(out: Out) -> int:
        from onboard.ladder.table import default_specs
        from onboard.ladder.states import ladder_states
        from onboard.cli.views import status_dict
        from onboard.workspace.layout import Workspace

        ws = Workspace.load(check_dir(dir), name)
        states = ladder_states(ws, default_specs())
        if out.json:
            out.emit(status_dict(ws, states))
        else:
            _print_status(out, ws, states)
        return 0

    run_command(json_out, body)


@app.command("list")
def list_cmd(dir: Path = DIR_OPTION, json_out: bool = JSON_OPTION):
    """Every workspace under onboarding/ with its current rung."""

    def body(out: Out) -> int:
        from rich.table import Table
        from rich.text import Text

        from onboard.ladder.table import default_specs
        from onboard.ladder.states import ladder_states
        from onboard.workspace.ledger import ACCEPTED
        from onboard.cli.views import status_dict
        from onboard.workspace.layout import LEDGER, Workspace, list_workspaces

        specs = default_specs()
        rows = []
        for root in list_workspaces(check_dir(dir)):
            try:
                ws = Workspace.load(dir, root.name)
                states = ladder_states(ws, specs)  # reads the files the rungs read: may meet an OS error too
            except (BadInput, OSError) as e:  # one unreadable ledger must not hide the other workspaces
                why = describe_os_error(e)[1] if isinstance(e, OSError) else " ".join(str(e).split())
                rows.append(
                    {"workspace": root.name, "status": "unreadable", "ledger": str(root / LEDGER), "error": why}
                )
                continue
            status = status_dict(ws, states)  # model_type and family from the workspace's files, not ladder.json's
            rows.append({"workspace": ws.name, **{k: status[k] for k in ("model_type", "family", "path")},
                         "rungs": {s.rung: s.status for s in states}, "message": status["message"]})  # fmt: skip
        if out.json:
            out.emit({"dir": str(Path(dir).resolve()), "workspaces": rows})
            return 0
        if not rows:
            out.print(f"no workspaces under {Path(dir) / 'onboarding'}; create one with `onboard new-model`")
            return 0
        table = Table(title=markup_safe(f"workspaces in {Path(dir).resolve() / 'onboarding'}"))
        for col in ("workspace", "model_type", "path", "passed", "status"):
            table.add_column(col)
        for r in rows:
            if "error" in r:  # Text, not markup: the message holds brackets (attempts[2])
                why = Text(visible(f"unreadable ledger: {r['error']}"), style="red")
                table.add_row(r["workspace"], "", "", "", why)
                continue
            passed = [k for k, v in r["rungs"].items() if v in ACCEPTED]
            table.add_row(  # model_type and path come from ladder.json: config strings
                r["workspace"], *(markup_safe(v or "") for v in (r["model_type"], r["path"])), ", ".join(passed) or "-",
                markup_safe(r["message"]),
            )  # fmt: skip
        out.print(table)
        return 0

    run_command(json_out, body)


@app.command("report")
def report_cmd(name: str = typer.Argument(...), dir: Path = DIR_OPTION, json_out: bool = JSON_OPTION):
    """Write REPORT.md, report.html and the PNG pictures into the workspace: the summary, the
    waterfall, the evidence of every rung."""

    def body(out: Out) -> int:
        from onboard.report.write import WATERFALL, write_report_files
        from onboard.workspace.layout import Workspace

        ws = Workspace.load(check_dir(dir), name)
        files = write_report_files(ws)
        if out.json:
            out.emit({"workspace": name, **files.to_json(), "waivers": list(ws.ledger.waivers().values())})
        else:
            out.print(f"wrote {files.markdown}\nreport.html: {files.html}\nwaterfall: {files.where(WATERFALL)}")
        return 0

    run_command(json_out, body)


# ---- waive -----------------------------------------------------------------------------------
@app.command("waive")
def waive_cmd(
    name: str = typer.Argument(...),
    rung: str = typer.Argument(..., help="The rung whose criterion is waived."),
    criterion: str = typer.Argument(..., help="The criterion name from checklists/<rung>.yaml."),
    why: str = typer.Option(..., "--why", help="The reason, on the record (a person's decision)."),
    dir: Path = DIR_OPTION,
    json_out: bool = JSON_OPTION,
):
    """Waive one criterion of a rung, with a reason; shown in red in status and the report. Finiteness
    and every run whole cannot be waived (gates.UNWAIVABLE_METRICS): a broken run proves nothing."""

    def body(out: Out) -> int:
        from onboard.ladder.gates import ChecklistError, load_checklist
        from onboard.ladder.table import RUNGS
        from onboard.workspace.ledger import Ledger
        from onboard.workspace.lock import WorkspaceLock
        from onboard.workspace.layout import Workspace

        ws = Workspace.load(check_dir(dir), name)
        if rung not in RUNGS:
            raise BadInput(f"unknown rung '{rung}' (rungs: {', '.join(RUNGS)})")
        try:
            checklist = load_checklist(rung)
        except ChecklistError:
            raise BadInput(f"rung '{rung}' is not built yet: it has no checklist to waive from") from None
        found = checklist.criterion(criterion)
        if found is None:
            names = ", ".join(c.name for c in checklist.criteria)
            raise BadInput(f"rung '{rung}' has no criterion '{criterion}' (criteria: {names})")
        if not found.waivable:  # finiteness, every run whole: a waived NaN would pass a run that proves nothing
            raise BadInput(f"{rung}/{found.unwaivable_why()}")
        if not why.strip():
            raise BadInput("--why must say why the criterion is waived")
        with WorkspaceLock(ws.root):
            ledger = Ledger.load(ws.ledger.path)
            waiver = ledger.add_waiver(rung, criterion, why.strip())
            ledger.save()
        if out.json:
            out.emit({"workspace": name, "waiver": waiver})
        else:
            out.print(f"[bold white on red]WAIVED[/] {rung}/{criterion}: {markup_safe(waiver['why'])}")
            out.print(f"recorded in {ws.ledger.path}; the next `onboard next-step {name}` counts it as ok-but-waived")
        return 0

    run_command(json_out, body)


# ---- demo / skill (train: onboard/cli/train_cmd.py) -----------------------------------------
@app.command("demo")
def demo_cmd(
    dir: Path = typer.Option(Path("demo-run"), "--dir", help="Folder for the demo workspace."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | tpu."),
    preset: str = typer.Option(
        "llama3_debug", "--preset", help="llama3_debug (a dense LLM) | flux_debug (a FLUX diffusion transformer)."
    ),
    timing: str = typer.Option(
        "shipped",
        "--timing",
        help="shipped (the checklists' timing protocol) | quick (each keep/choose decision after a few rounds: "
        "whether the rungs pass, not which choice is fastest; the ledger and report say so).",
    ),
    precision: str = typer.Option(
        "fp32",
        "--precision",
        help="fp32 | bf16: the precision the demo's recipe starts in (bf16: training.dtype and "
        "mixed_precision_param bfloat16, as a recipe that trains in bf16; every gate then judges with bf16's bounds).",
    ),
    no_train: bool = typer.Option(
        False,
        "--no-train",
        help="Stop after the ladder: skip training a pretrained checkpoint on JSONL data with the proved recipe.",
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace an earlier demo under --dir, keeping its folders as <name>.backup-<time>."
    ),
    json_out: bool = JSON_OPTION,
):
    """new-model for a built-in debug model, next-step up the whole ladder, status, report; then the
    proved recipe trains a pretrained checkpoint on JSONL data, validates, exports and reloads it."""

    def body(out: Out) -> int:
        from onboard.cli.demo import run_demo

        result = run_demo(dir, device=device, out=out, preset=preset, timing=timing, precision=precision,
                          train=not no_train, force=force)  # fmt: skip
        if out.json:
            out.emit(result)
        return result["exit_code"]

    run_command(json_out, body)


@skill_app.command("install")
def skill_install_cmd(
    agent: str = typer.Option(..., "--agent", help="claude | codex | generic."),
    dir: Path = DIR_OPTION,
    json_out: bool = JSON_OPTION,
):
    """Install the onboard-model skill where that agent loads skills."""

    def body(out: Out) -> int:
        from onboard.cli.skill_install import install

        result = install(agent, check_dir(dir, workspaces=False))
        if out.json:
            out.emit(result)
        else:
            where = result["skill_dir"] + (f" (+ section in {result['agents_md']})" if result["agents_md"] else "")
            out.print(f"installed the onboard-model skill for {agent}: {where}")
        return 0

    run_command(json_out, body)


# the commands around the ladder's result (recipe, plan, compat), on the same app
from onboard.cli import handover as cli_handover  # noqa: E402,F401
from onboard.cli import export_cmd as cli_export  # noqa: E402,F401  # `onboard export`
from onboard.cli import train_cmd as cli_train  # noqa: E402,F401  # `onboard train`


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
