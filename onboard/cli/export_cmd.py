"""`onboard export NAME --to DIR [--from CHECKPOINT | --from-initial] [--tokenizer PATH]`: the workspace's
trained weights as a folder a user ships (save_pretrained layout: config.json, sharded safetensors and
their index, the tokenizer), the same export `checkpoint.export_hf` writes at the end of a run
(titan_core/training/hf_export.py).

The weights are the newest checkpoint under the recipe's checkpoint folder, or the one `--from`
names (a `step-N` folder, or a checkpoint folder whose newest step is taken). The recipe's untrained
`checkpoint.initial_hf` weights only when `--from-initial` asks for them: a folder of untrained weights
under the name of a trained model is worse than none, so with no checkpoint the export is refused.
The tokenizer is the recipe's (data.tokenizer = "hf": its tokenizer.json and the files beside it),
or the one `--tokenizer` names (a run trained with --data.tokenizer_path on its command line); one
that is missing refuses the export, and a recipe without an HF tokenizer (byte, bpe) is said in a line.
DIR may not lie inside onboarding/ (nor hold it): with --force the workspace there would be moved aside.
An existing DIR is refused unless --force, which keeps it as DIR.backup-<UTC time>. A recipe with [lora]
exports its adapter in PEFT's layout (adapter_model.safetensors + its config, for checkpoint.initial_hf's
base), or with --merged the merged full model: what such a run's own export writes
(titan_core/training/lora_export.py). Registered on the app of onboard/cli/shared.py; onboard/cli/app.py
imports this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from onboard.cli.shared import DIR_OPTION, JSON_OPTION, Out, app, check_dir, run_command
from onboard.errors import BadInput
from onboard.workspace.fsutil import BACKUP_INFIX


def find_checkpoint(cfg, source: Path | None) -> Path | None:
    """The DCP checkpoint to export: `source` (a step folder, or a folder of them), else the newest
    under the recipe's checkpoint folder; None when the recipe's folder holds none."""
    from titan_core.training.checkpoint import Checkpointer  # lazy: torch loads when an export runs

    if source is not None:
        source = Path(source)
        if (source / ".metadata").is_file():
            return source
        step = Checkpointer(source, 0, True).latest_step()
        if step is None:
            raise BadInput(f"--from {source}: neither a checkpoint (step-N with DCP .metadata) nor a folder of them")
        return source / f"step-{step}"
    ckpt = Checkpointer.from_config(cfg)
    step = ckpt.latest_step()
    return None if step is None else ckpt.folder / f"step-{step}"


def check_target(to: Path, workspaces: Path, root: Path) -> None:
    """BadInput when `to` lies inside the workspaces' folder (or the workspace `root`, wherever a link
    puts it), or holds it: an export there with --force would move a workspace, or all of them, aside
    as a backup, out of `onboard list`."""
    target, folder = Path(to).resolve(), Path(workspaces).resolve()
    for base in dict.fromkeys((folder, Path(root).resolve())):
        what = "the workspaces' folder" if base == folder else "the workspace's folder"
        if target == base or base in target.parents:
            raise BadInput(
                f"--to {to} is inside {base}, {what}: an export there could replace a workspace; "
                "choose a folder outside it, e.g. exported/NAME"
            )
        if target in base.parents:
            raise BadInput(f"--to {to} holds {base}, {what}: choose a folder of its own, e.g. exported/NAME")


def export_tokenizer(data, tokenizer: Path | None) -> tuple[list[tuple[Path, str]], str]:
    """(files to copy, one line saying which tokenizer the export carries); ConfigError when the
    tokenizer the recipe (or --tokenizer) names is missing."""
    from titan_core.training.hf_export import hf_tokenizer_files, tokenizer_files  # lazy: torch loads with it

    if tokenizer is not None:
        files = hf_tokenizer_files(tokenizer, what="--tokenizer")
        return files, f"tokenizer from --tokenizer {tokenizer}: {', '.join(n for _, n in files)}"
    files = tokenizer_files(data)
    if files:
        return files, f"tokenizer from data.tokenizer_path {data.tokenizer_path}: {', '.join(n for _, n in files)}"
    return [], (
        f'no tokenizer written: the recipe\'s data.tokenizer is "{data.tokenizer}", not a Hugging Face tokenizer '
        "(a run trained with --data.tokenizer=hf: pass its tokenizer with --tokenizer PATH); the folder holds the "
        "config and the weights only"
    )


def export_workspace(ws, to: Path, *, source: Path | None = None, from_initial: bool = False,
                     tokenizer: Path | None = None, force: bool = False, workspaces: Path | None = None,
                     merged: bool = False, log=lambda line: None) -> dict:  # fmt: skip
    """Export the workspace's weights into `to` (module docstring); returns what was written.
    `workspaces`: the onboarding/ folder the workspace was loaded from (default: its root's parent)."""
    # lazy: a command module (typer builds the whole app on every call): torch loads when an export runs
    from titan_core.config.dtypes import DTYPES  # lazy: as above
    from titan_core.config.loader import load_config  # lazy: as above
    from titan_core.training.checkpoint import Checkpointer, frozen_base_of, load_model_weights  # lazy: as above
    from titan_core.training.hf_export import export_hf  # lazy: as above
    from titan_core.training.hf_load import initial_weights  # lazy: as above
    from titan_core.lora.inject import apply_lora  # lazy: as above
    from titan_core.training.lora_export import export_lora  # lazy: as above
    from titan_core.models.model_builder import build_model_from_config, materialize_on_cpu  # lazy: as above
    from titan_core.models.model_builder import model_adapter  # lazy: as above

    to = Path(to)
    check_target(to, ws.root.parent if workspaces is None else workspaces, ws.root)
    if (to.exists() or to.is_symlink()) and not force:
        raise BadInput(f"{to} exists: pass --force to replace it (the old one is then kept as {to.name}{BACKUP_INFIX}<time>)")
    if source is not None and from_initial:
        raise BadInput("--from and --from-initial name two different weights: give one of them")
    cfg = load_config(ws.recipe_path, [])
    if merged and not cfg.lora.enable:
        raise BadInput(f"--merged merges LoRA adapters, and {ws.recipe_path} has no [lora] enabled")
    files, tokenizer_line = export_tokenizer(cfg.data, tokenizer)  # a missing tokenizer is refused before any work
    family, args, model = build_model_from_config(cfg.model)
    initial = checkpoint = None
    if from_initial:
        if not cfg.checkpoint.initial_hf:
            raise BadInput(f"--from-initial: {ws.recipe_path} names no checkpoint.initial_hf to export")
    if from_initial or frozen_base_of(cfg):  # a LoRA run's checkpoints leave its base (initial_hf) out
        initial = initial_weights(cfg, model)  # the header check, on meta, before anything is allocated
    if not from_initial:
        checkpoint = find_checkpoint(cfg, source)
        if checkpoint is None:
            raise BadInput(
                f"no checkpoint to export: {Checkpointer.from_config(cfg).folder} holds none; train first "
                f"(onboard train {ws.name}), name one with --from CHECKPOINT, or export the untrained "
                "checkpoint.initial_hf weights with --from-initial"
            )
    model = materialize_on_cpu(model, cfg.training.seed, DTYPES[cfg.training.dtype])
    if initial is not None:  # the base goes in by its own names, before peft renames them
        initial.load(model)
    lora = apply_lora(model, cfg.lora, model_adapter(cfg.model), seed=cfg.training.seed) if cfg.lora.enable else None
    if checkpoint is not None:
        log(f"loading {checkpoint}")
        load_model_weights(checkpoint, model, frozen_base=frozen_base_of(cfg))
        origin = f"checkpoint {checkpoint}"
    else:
        log(f"--from-initial: exporting the untrained checkpoint.initial_hf {cfg.checkpoint.initial_hf}")
        origin = f"checkpoint.initial_hf {cfg.checkpoint.initial_hf} (untrained)"
    earlier = set(to.parent.glob(f"{to.name}{BACKUP_INFIX}*"))
    replace = "force" if force else "never"
    if cfg.lora.enable:
        out = export_lora(model, lora, cfg, family, args, to, merged=merged, tokenizer=files, replace=replace)
    else:
        out = export_hf(model, family, args, to, model_cfg=cfg.model, shard_mb=cfg.checkpoint.export_shard_mb,
                        tokenizer=files, replace=replace)  # fmt: skip
    written = sorted(p.name for p in out.iterdir())
    backup = sorted(set(to.parent.glob(f"{to.name}{BACKUP_INFIX}*")) - earlier)  # the one this export made
    return {
        "workspace": ws.name,
        "to": str(out),
        "from": origin,
        "files": written,
        "tokenizer": [name for _, name in files],
        "tokenizer_note": tokenizer_line,
        "bytes": sum((out / f).stat().st_size for f in written),
        "backup": str(backup[-1]) if backup else None,
    }


@app.command("export")
def export_cmd(
    name: str = typer.Argument(...),
    to: Path = typer.Option(
        ...,
        "--to",
        help="Folder to write (save_pretrained layout) outside onboarding/; not an existing one without --force.",
    ),
    source: Optional[Path] = typer.Option(
        None, "--from", help="A checkpoint (step-N) or a folder of them (default: the newest of the recipe's)."
    ),
    from_initial: bool = typer.Option(
        False, "--from-initial", help="Export the recipe's untrained checkpoint.initial_hf weights (never by default)."
    ),
    tokenizer: Optional[Path] = typer.Option(
        None, "--tokenizer", help="The run's tokenizer.json or its folder (default: the recipe's data.tokenizer_path)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing --to folder, keeping it as <to>.backup-<time>."),
    merged: bool = typer.Option(
        False, "--merged", help="A [lora] recipe: the merged full model (save_pretrained layout), not the PEFT adapter."
    ),
    dir: Path = DIR_OPTION,
    json_out: bool = JSON_OPTION,
):
    """Export the workspace's trained weights as a Hugging Face folder (config.json, sharded
    safetensors and their index, the tokenizer): what checkpoint.export_hf writes after a run."""

    def body(out: Out) -> int:
        from onboard.workspace.layout import Workspace, workspaces_dir  # lazy: as the other commands, in the command

        ws = Workspace.load(check_dir(dir), name)
        result = export_workspace(ws, to, source=source, from_initial=from_initial, tokenizer=tokenizer, force=force,
                                  workspaces=workspaces_dir(dir), merged=merged, log=out.log)  # fmt: skip
        if out.json:
            out.emit(result)
        else:
            # soft_wrap: each is one line, whatever the terminal's width (paths are long)
            line = f"exported {result['from']} to {result['to']}: {', '.join(result['files'])}"
            out.print(line, markup=False, soft_wrap=True)
            out.print(result["tokenizer_note"], markup=False, soft_wrap=True)
            if result["backup"]:
                out.print(f"the previous folder is kept as {result['backup']}", markup=False, soft_wrap=True)
        return 0

    run_command(json_out, body)
