"""`onboard export NAME --to DIR [--from CHECKPOINT]`: the workspace's trained weights as a folder a
user ships (save_pretrained layout: config.json, sharded safetensors and their index, the tokenizer),
the same export `checkpoint.export_hf` writes at the end of a run (titan_core/training/hf_export.py).

The weights are the newest checkpoint under the recipe's checkpoint folder, or the one `--from`
names (a `step-N` folder, or a checkpoint folder whose newest step is taken); with no checkpoint,
the recipe's `checkpoint.initial_hf` weights; with neither, there is nothing to export: train first.
An existing DIR is refused unless --force, which keeps it as DIR.backup-<UTC time>. Registered on the app of
onboard/cli/shared.py; onboard/cli/app.py imports this module.
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


def export_workspace(ws, to: Path, *, source: Path | None = None, force: bool = False, log=lambda line: None) -> dict:
    """Export the workspace's weights into `to` (module docstring); returns what was written."""
    # lazy: a command module (typer builds the whole app on every call): torch loads when an export runs
    from titan_core.config.dtypes import DTYPES  # lazy: as above
    from titan_core.config.loader import load_config  # lazy: as above
    from titan_core.training.checkpoint import load_model_weights  # lazy: as above
    from titan_core.training.hf_export import export_hf, tokenizer_files  # lazy: as above
    from titan_core.training.hf_load import initial_weights  # lazy: as above
    from titan_core.training.model_builder import build_model_from_config, materialize_on_cpu  # lazy: as above

    to = Path(to)
    if (to.exists() or to.is_symlink()) and not force:
        raise BadInput(f"{to} exists: pass --force to replace it (the old one is then kept as {to.name}{BACKUP_INFIX}<time>)")
    cfg = load_config(ws.recipe_path, [])
    family, args, model = build_model_from_config(cfg.model)
    checkpoint = find_checkpoint(cfg, source)
    initial = None
    if checkpoint is None:
        if not cfg.checkpoint.initial_hf:
            from titan_core.training.checkpoint import Checkpointer  # lazy: as above

            raise BadInput(
                f"no checkpoint to export: {Checkpointer.from_config(cfg).folder} holds none and the recipe names no "
                f"checkpoint.initial_hf; train first: onboard train --config {ws.recipe_path}"
            )
        initial = initial_weights(cfg, model)  # the header check, on meta, before anything is allocated
    model = materialize_on_cpu(model, cfg.training.seed, DTYPES[cfg.training.dtype])
    if checkpoint is not None:
        log(f"loading {checkpoint}")
        load_model_weights(checkpoint, model)
        origin = f"checkpoint {checkpoint}"
    else:
        log(f"no checkpoint: exporting checkpoint.initial_hf {cfg.checkpoint.initial_hf}")
        initial.load(model)
        origin = f"checkpoint.initial_hf {cfg.checkpoint.initial_hf}"
    earlier = set(to.parent.glob(f"{to.name}{BACKUP_INFIX}*"))
    out = export_hf(model, family, args, to, model_cfg=cfg.model, shard_mb=cfg.checkpoint.export_shard_mb,
                    tokenizer=tokenizer_files(cfg.data), replace="force" if force else "never")  # fmt: skip
    files = sorted(p.name for p in out.iterdir())
    backup = sorted(set(to.parent.glob(f"{to.name}{BACKUP_INFIX}*")) - earlier)  # the one this export made
    return {
        "workspace": ws.name,
        "to": str(out),
        "from": origin,
        "files": files,
        "bytes": sum((out / f).stat().st_size for f in files),
        "backup": str(backup[-1]) if backup else None,
    }


@app.command("export")
def export_cmd(
    name: str = typer.Argument(...),
    to: Path = typer.Option(
        ..., "--to", help="Folder to write (save_pretrained layout); must not exist without --force."
    ),
    source: Optional[Path] = typer.Option(
        None, "--from", help="A checkpoint (step-N) or a folder of them (default: the newest of the recipe's)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing --to folder, keeping it as <to>.backup-<time>."),
    dir: Path = DIR_OPTION,
    json_out: bool = JSON_OPTION,
):
    """Export the workspace's trained weights as a Hugging Face folder (config.json, sharded
    safetensors and their index, the tokenizer): what checkpoint.export_hf writes after a run."""

    def body(out: Out) -> int:
        from onboard.workspace.layout import Workspace  # lazy: as the other commands, inside the command

        ws = Workspace.load(check_dir(dir), name)
        result = export_workspace(ws, to, source=source, force=force, log=out.log)
        if out.json:
            out.emit(result)
        else:
            out.print(f"exported {result['from']} to {result['to']}: {', '.join(result['files'])}", markup=False)
            if result["backup"]:
                out.print(f"the previous folder is kept as {result['backup']}", markup=False)
        return 0

    run_command(json_out, body)
