"""`onboard recipe NAME`: the recipe a workspace hands over, what the ladder earned in it, the
exact commands that run it on one process, on this host, and on many hosts, and the one that
continues training the user's checkpoint on the user's data with it (`continue_training`).

Earned settings come from the ledger, not from the file's comments: each recipe edit a passed
rung made (`recipe_edit` of its entry), shown when the recipe still holds that value; one a
person has since changed by hand is listed as overridden, since no gate proved the new value
until the ladder re-verifies it (`status` then shows the stale rungs). What the ladder proves is
re-derived as `status` derives it (onboard/ladder/states.py): each rung not passed is listed with
its state and reason, and an edit whose rung's evidence does not stand (invalid, stale) says so.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from onboard.errors import BadInput
from onboard.sanitize import visible
from onboard.ladder.states import ladder_states
from onboard.ladder.table import default_specs
from onboard.workspace.layout import Workspace
from titan_core.config.loader import get_key
from titan_core.runtime.argv import LAUNCH
from onboard.workspace.ledger import ACCEPTED, Status

RDZV_PORT = 29500


def earned_settings(ws: Workspace, recipe: dict) -> list[dict]:
    """The latest edit of each key made by a rung, with whether the recipe still holds it."""
    latest: dict[str, dict] = {}
    for entry in ws.ledger.attempts:
        for edit in ((entry.get("recipe_edit") or {}).get("edits")) or []:
            latest[edit["key"]] = {"key": edit["key"], "value": edit["value"], "why": edit.get("why", ""),
                                   "rung": entry["rung"], "attempt": entry["attempt"]}  # fmt: skip
    out = []
    for key, edit in latest.items():
        now = get_key(recipe, key, None)
        out.append({**edit, "in_recipe": now == edit["value"], "recipe_value": now})
    return out


def proof_of(ws: Workspace) -> list[dict]:
    """Each rung's state as every reader re-derives it from the workspace's files ({rung, status,
    reason}): what of the recipe the ladder proves now."""
    return [{"rung": s.rung, "status": str(s.status), "reason": s.reason} for s in ladder_states(ws, default_specs())]


def _mark_unproved(earned: list[dict], ladder: list[dict]) -> None:
    """Say of each earned setting whose rung's evidence does not stand now (invalid, stale, ...) why."""
    state = {r["rung"]: r for r in ladder}
    for e in earned:
        r = state.get(e["rung"])
        e["proved"] = r is not None and r["status"] in ACCEPTED
        e["not_proved_why"] = None if e["proved"] else f"{e['rung']} is {r['status'] if r else 'unknown'}" + (
            f": {r['reason']}" if r and r.get("reason") else "")  # fmt: skip


def _host_processes(ws: Workspace, recipe: dict) -> tuple[int, str]:
    """(processes for `--nproc` on this host, why that many)."""
    passed = [e for e in ws.ledger.entries("simple_fsdp") if e.get("status") == Status.PASSED]
    sharded = (passed[-1].get("measurements") or {}) if passed else {}
    device = get_key(recipe, "device.type", None) or "auto"
    if device in ("cuda", "auto"):
        import torch  # lazy: torch (onboard recipe must start without torch; only a cuda/auto recipe counts GPUs)

        if torch.cuda.is_available():
            return torch.cuda.device_count(), f"the {torch.cuda.device_count()} CUDA device(s) of this host"
    if sharded.get("world_size"):
        return int(sharded["world_size"]), "the world size the simple_fsdp rung verified"
    return 2, "two processes (no sharded run on record)"


def per_rank_batch(recipe: dict, ranks: int) -> tuple[int | None, str]:
    """(training.batch_size each of `ranks` data-parallel ranks gets, why), so that together they
    run the recipe's global batch: the batch every gate verified (eager ran it on one process, the
    simple_fsdp rung split it over its ranks). titan_core's batch_size is per rank, so a
    multi-process line that did not set it would train `ranks` times the rows. None when the
    global batch does not split over the ranks."""
    b = get_key(recipe, "training.batch_size", None)
    if not isinstance(b, int) or b < 1:
        return None, "the recipe has no training.batch_size"
    if b % ranks:
        return None, (f"training.batch_size = {b} (the global batch the gates verified) does not split over "
                      f"{ranks} ranks: choose a process count that divides it")  # fmt: skip
    return b // ranks, f"{b // ranks} rows per rank x {ranks} ranks = the global batch of {b} the gates verified"


def world_of(recipe: dict) -> tuple[int, int] | None:
    """(processes, data-parallel ranks) the recipe's parallelism degrees name (dp_replicate x dp_shard
    x tp, and without tp, whose ranks share their data-parallel rank's rows); None when a degree fills
    from the world size (-1, dp_shard's default)."""
    par = recipe.get("parallelism") if isinstance(recipe.get("parallelism"), dict) else {}
    degrees = [par.get(k, d) for k, d in (("dp_replicate", 1), ("dp_shard", -1), ("tp", 1))]
    if not all(isinstance(d, int) and d > 0 for d in degrees):
        return None
    return degrees[0] * degrees[1] * degrees[2], degrees[0] * degrees[1]


def unquote_placeholders(line: str, names) -> str:
    """`line` with the shell quoting shlex put around each word holding one of `names` ($HEAD_NODE,
    $DATA, ...) taken off: they are meant for the user's shell to fill in."""
    for name in names:
        line = re.sub(rf"'([^' ]*){re.escape(name)}([^' ]*)'", rf"\1{name}\2", line)
    return line


def _torchrun(ws: Workspace, recipe: dict, per_node: int) -> tuple[str, str]:
    """The multi-host line and how its node count was filled in."""
    world_dp = world_of(recipe)
    batch_flag: list[str] = []
    if world_dp is not None:
        world, dp = world_dp
        if world % per_node:
            raise BadInput(
                f"{ws.recipe_path}: parallelism degrees multiply to {world} processes, which do not split into "
                f"hosts of {per_node}; set the degrees to a multiple of {per_node}"
            )
        nnodes, how = str(world // per_node), f"dp_replicate x dp_shard x tp = {world} processes, {per_node} per host"
        rows, why = per_rank_batch(recipe, dp)
        batch_flag = [f"--training.batch_size={rows}"] if rows else []
        how += f"; {why}"
    else:
        nnodes, how = "$NNODES", "a degree fills from the world size (-1): set NNODES to the number of hosts"
        how += ("; set --training.batch_size to the recipe's batch_size / the data-parallel ranks, so that "
                "together they run the global batch the gates verified")  # fmt: skip
    line = shlex.join([
        *LAUNCH, f"--nnodes={nnodes}", f"--nproc-per-node={per_node}", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=$HEAD_NODE:{RDZV_PORT}", f"--rdzv-id={ws.name}", "-m", "titan_core.train",
        "--config", "recipe.toml", *batch_flag,
    ])  # fmt: skip
    line = unquote_placeholders(line, ("$NNODES", "$HEAD_NODE"))
    return f"cd {shlex.quote(str(ws.root))} && {line}", how


FILL_IN = {
    "$DATA": "your training data: JSONL, JSON, Parquet or text files (a file, folder or glob; data.field: the column)",
    "$VALID_DATA": "held-out data in the same form, for the validation loss every validation.freq steps",
    "$STEPS": "optimizer steps to train (the recipe's training.steps is the gates' short run)",
    "$EXPORT_DIR": "where the trained model is written in save_pretrained layout (sharded safetensors, tokenizer)",
}
"""The placeholders of the continue-training line, each with what to put there (shell variables, so the
line runs once they are set)."""


def _checkpoint(ws: Workspace, recipe: dict) -> tuple[str | None, str]:
    """(the checkpoint the user's model continues from, where it comes from); None when the workspace has none."""
    named = get_key(recipe, "checkpoint.initial_hf", None)
    if isinstance(named, str) and named:
        path = Path(named) if Path(named).is_absolute() else ws.recipe_path.parent / named  # as the loader anchors it
        return str(path.resolve()), "the recipe's checkpoint.initial_hf"
    if ws.weights_dir is not None:
        return str(ws.weights_dir), "new-model --weights (the recipe leaves it out: see its comment)"
    return None, "no checkpoint: new-model had no --weights and the recipe names no checkpoint.initial_hf"


def continue_training(ws: Workspace, recipe: dict, per_node: int, rows: int | None) -> dict:
    """The command that continues training the user's checkpoint on the user's data with the proved
    recipe: titan_core's entry point under torchrun on this host, the checkpoint as checkpoint.initial_hf
    (overrides, so the recipe file stays the one the gates proved), the model's own tokenizer, a
    datasets source, validation, checkpoints to resume from, and the export. With a twin the full model of
    config.json replaces the twin the gates trained. Placeholders: FILL_IN."""
    folder, source = _checkpoint(ws, recipe)
    ckpt = folder or "$CHECKPOINT"
    tokenizer = folder if folder and (Path(folder) / "tokenizer.json").is_file() else "$TOKENIZER"
    fill = dict(FILL_IN)
    if folder is None:
        fill["$CHECKPOINT"] = "a Hugging Face model folder: config.json and model.safetensors (or its sharded index)"
    if tokenizer == "$TOKENIZER":
        fill["$TOKENIZER"] = "the model's tokenizer.json, or a folder holding it with tokenizer_config.json"
    argv = [*LAUNCH, f"--nproc-per-node={per_node}", "-m", "titan_core.train", "--config", str(ws.recipe_path)]
    if per_node > 1 and rows:
        argv.append(f"--training.batch_size={rows}")
    notes = []
    if ws.twin_path is not None and ws.hf_config_path is not None:
        argv.append(f"--model.hf_config={ws.hf_config_path}")
        notes.append("the gates trained a twin; this line trains the full model of config.json, on a host it fits")
    argv += [
        f"--checkpoint.initial_hf={ckpt}", "--data.source=dataset", "--data.path=$DATA", "--data.tokenizer=hf",
        f"--data.tokenizer_path={tokenizer}", "--training.steps=$STEPS", "--validation.enable=true",
        "--validation.path=$VALID_DATA", "--checkpoint.enable=true", "--checkpoint.export_hf=$EXPORT_DIR",
    ]  # fmt: skip
    line = unquote_placeholders(shlex.join(argv), fill)
    return {"command": line, "checkpoint": folder, "checkpoint_from": source, "fill_in": fill, "notes": notes}


def recipe_view(ws: Workspace) -> dict:
    """Everything `onboard recipe` prints, as one JSON-ready dict."""
    text = ws.recipe_path.read_text(encoding="utf-8")
    try:
        recipe = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{ws.recipe_path}: not valid TOML ({e})") from None
    config = shlex.quote(str(ws.recipe_path))
    per_node, why = _host_processes(ws, recipe)
    many, how = _torchrun(ws, recipe, per_node)
    rows, rows_why = per_rank_batch(recipe, per_node)
    this_host = f"onboard train --config {config} --nproc {per_node}"
    if per_node > 1:
        this_host += f" --training.batch_size={rows}" if rows else ""
        why += f"; {rows_why}"
    ladder = proof_of(ws)
    earned = earned_settings(ws, recipe)
    _mark_unproved(earned, ladder)
    return {
        "workspace": ws.name,
        "recipe": str(ws.recipe_path),
        "text": text,
        "earned": earned,
        "ladder": ladder,
        "proved": all(r["status"] in ACCEPTED for r in ladder if r["status"] != Status.NOT_BUILT),
        "not_proved": [r for r in ladder if r["status"] not in ACCEPTED and r["status"] != Status.NOT_BUILT],
        "commands": {
            "one_process": f"onboard train --config {config}",
            "this_host": this_host,
            "many_hosts": many,
        },
        "this_host_why": why,
        "per_rank_batch_size": rows if per_node > 1 else None,
        "many_hosts_how": how,
        "many_hosts_note": (
            "run the same line on every host; HEAD_NODE is the address of the host that serves the "
            "rendezvous. Relative paths in the recipe resolve against its folder"
        ),
        "continue_training": continue_training(ws, recipe, per_node, rows),
    }


def recipe_lines(view: dict) -> list[str]:
    """The text form: the earned settings, then the commands (the recipe itself is printed first)."""
    lines = ["", "earned by the ladder:"]
    if not view["earned"]:
        lines.append("  nothing yet: every value is new-model's default")
    for e in view["earned"]:
        state = "" if e["in_recipe"] else f"  [overridden by hand: the recipe now says {e['recipe_value']!r}]"
        state += f"  [not proved: {e['not_proved_why']}]" if e.get("not_proved_why") else ""
        lines.append(f"  {e['key']} = {e['value']!r}  ({e['rung']} attempt {e['attempt']}: {e['why']}){state}")
    lines += ["", "proved by the ladder:" if view["proved"] else "not proved yet (as `onboard status` derives it):"]
    for r in view["not_proved"]:
        # a reason quotes the workspace's files (paths, recorded values): made visible, never raw
        lines.append(f"  {r['rung']}: {r['status']}" + (f": {visible(r['reason'])}" if r.get("reason") else ""))
    if view["proved"]:
        lines.append("  every built rung passed or does not apply, each re-derived from its own files")
    c = view["commands"]
    lines += [
        "",
        "run it:",
        f"  one process:  {c['one_process']}",
        f"  this host:    {c['this_host']}   # {view['this_host_why']}",
        f"  many hosts:   {c['many_hosts']}",
        f"                # {view['many_hosts_how']}; {view['many_hosts_note']}",
    ]
    go = view["continue_training"]
    lines += ["", f"continue training the checkpoint on your data ({go['checkpoint_from']}):", f"  {go['command']}"]
    lines += [f"  # {note}" for note in go["notes"]]
    lines += [f"  #   {name}: {what}" for name, what in go["fill_in"].items()]
    return lines
