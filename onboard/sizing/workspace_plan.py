"""`onboard plan NAME --target KIND[:COUNT] [--seq N]`: the full model of a workspace, planned for
the machine it will train on, and the recipe to run it there.

The arithmetic is onboard/sizing/plan.py (the memory model that refuses oversized runs, with each
rank materialising only its shard, and a roofline step time). This module reads the
workspace: the full model of config.json (not the twin the gates ran) built on meta through
the recipe's [model] section, the levers the ladder earned in recipe.toml (re-decided for the
target where the twin's size or this machine earned them: onboard/sizing/plan_levers.py), and
writes `recipe.<kind>-<count>.seq<seq>.toml`: recipe.toml with every flag the ladder earned,
plus the planned model file, mesh, batch, sequence, precision, memory policy and execution
mode, each line with its reason, and the `torchrun` line that runs it. Nothing is allocated.
`onboard plan --check` then runs that recipe on the twin (onboard/sizing/plan_check.py).

A person may edit the recipe a plan wrote (it is theirs to take to the cluster), so plan knows its
own file by a stamp: its first line holds the sha256 of the rest as plan wrote it (`STAMP`). Plan
rewrites the file when the stamp still matches (nothing in it changed since) and otherwise refuses
without `--force`, which first moves the edited file to `<name>.backup-<time>` beside it. A file
with no stamp (hand-made, or written before plans were stamped) counts as edited.
"""

from __future__ import annotations

import copy
import hashlib
import shlex
from pathlib import Path
from typing import Any

import torch

from onboard.ladder.recipe_edit import RecipeEditError, edit_text
from onboard.errors import BadInput
from onboard.ladder.contract import RecipeEdit
from onboard.sizing.plan import EFFICIENCY, moe_kernel, parse_target, plan_training
from onboard.sizing.plan_check import check_lines
from onboard.sizing.plan_levers import Lever, merged, mode_levers, planning_kernels
from onboard.workspace.fsutil import BACKUP_INFIX, atomic_write_text, backup_aside
from onboard.workspace.layout import HF_CONFIG, Workspace
from titan_core.config import ConfigError, load_config
from titan_core.config.hf_config import read_hf_config
from titan_core.memory.budget import cpu_budget
from titan_core.memory.estimate import ModelShape, format_bytes
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import flops_per_token
from titan_core.parallel.plans import TP_PLANS
from titan_core.runtime.cpu_peak import measured_cpu_peak
from titan_core.training.model_builder import build_meta_model, resolve_model_args

DEFAULT_SEQ = 4096
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_target_positions")
"""The names transformers' configs give the longest sequence a model was trained for, most common first."""
RDZV_PORT = 29500
STAMP = "# onboard plan wrote this file; sha256 of the lines below as written: "
"""The first line of a plan's recipe, the hex digest after it: how plan tells its own file from an edited one."""


def _full_model(ws: Workspace, cfg):
    """(args, meta model) of the full model: the recipe's [model] with config.json as its architecture."""
    full = copy.deepcopy(cfg.model)
    if ws.hf_config_path is not None:
        full.hf_config = str(ws.hf_config_path)
    args = resolve_model_args(full)
    return full, args, build_meta_model(full, args)


def _target(spec: str):
    kind = str(spec).partition(":")[0].strip().lower()
    cpu_memory = cpu_peak = None
    if kind == "cpu":
        budget = cpu_budget()
        cpu_memory = budget.bytes if budget else None
        cpu_peak = measured_cpu_peak(torch.float32)
    try:
        return parse_target(spec, cpu_memory=cpu_memory, cpu_peak=cpu_peak)
    except ConfigError as e:
        raise BadInput(str(e)) from None


def plan_workspace_target(ws: Workspace, target_spec: str, *, seq: int = DEFAULT_SEQ, efficiency: float | None = None):
    """(titan_core Plan, facts about the model) for the workspace on `target_spec`; BadInput for bad input."""
    if seq < 1:
        raise BadInput(f"--seq {seq}: must be a positive number of tokens")
    if efficiency is not None and not 0 < efficiency <= 1:
        raise BadInput(f"--efficiency {efficiency}: must be in (0, 1], the fraction of peak the FLOPs reach")
    target = _target(target_spec)
    cfg = load_config(ws.recipe_path)
    full, args, model = _full_model(ws, cfg)
    shape = ModelShape.from_model(model, args)
    counts = count_params(model)
    tp_plan = full.family in TP_PLANS and not full.module_file
    twin_args = resolve_model_args(cfg.model) if ws.twin_path is not None else None
    kernels, levers = planning_kernels(cfg, args, target, twin_args=twin_args)
    plan = plan_training(
        shape, counts, lambda s: flops_per_token(args, s), target, seq_len=seq,
        kernels=kernels, tp_plan=tp_plan, efficiency=efficiency or EFFICIENCY,
    )  # fmt: skip
    if plan.chosen is not None:
        policy = plan.chosen.policy
        levers = merged(levers + mode_levers(cfg, args, target, kernels, policy, moe_kernel(kernels, target, policy)))
    facts = {"family": full.family, "tp_plan": tp_plan, "layers": args.n_layers, "model": _model_file(ws),
             "levers": levers, "warnings": seq_warnings(ws, args, plan)}  # fmt: skip
    return plan, facts


def max_positions(ws: Workspace, args) -> tuple[int, str] | None:
    """(the longest sequence the model's config declares, where it says so); None when it declares none.
    A config may name it otherwise (GPT-2's n_positions) or keep it in its text config (Gemma-3)."""
    if ws.hf_config_path is not None:
        cfg = read_hf_config(ws.hf_config_path)
        for where, table in (("", cfg), ("text_config.", cfg.get("text_config"))):
            for key in POSITION_KEYS if isinstance(table, dict) else ():
                declared = table.get(key)
                if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
                    return declared, f"{HF_CONFIG}'s {where}{key}"
        return None
    return args.max_seq_len, "the flavor's max_seq_len"


def seq_warnings(ws: Workspace, args, plan) -> list[str]:
    """A warning when the sequence asked for is longer than the model declares it handles (the plan only
    ever shortens it)."""
    limit = max_positions(ws, args)
    if limit is None or plan.seq_len_asked <= limit[0]:
        return []
    planned = f" (the plan's recipe trains at seq {plan.seq_len})" if plan.seq_len != plan.seq_len_asked else ""
    return [
        f"--seq {plan.seq_len_asked} exceeds {limit[1]} ({limit[0]}){planned}: positions past it were never "
        "trained, and RoPE scaling tuned for that length may not extend"
    ]


def _model_file(ws: Workspace) -> str:
    return HF_CONFIG if ws.hf_config_path is not None else "the recipe's flavor"


def recipe_name(plan) -> str:
    """The plan recipe's file name: target and sequence, e.g. recipe.v7x-64.seq4096.toml."""
    return f"recipe.{plan_stem(plan)}.toml"


def plan_stem(plan) -> str:
    """What names a plan's files and runs: `<kind>-<count>.seq<seq>` (the sequence the recipe trains at)."""
    return f"{plan.target.name}.seq{plan.seq_len}"


def recipe_edits(ws: Workspace, plan, levers: list[Lever]) -> list[RecipeEdit]:
    """The planned settings as recipe edits, each with its reason; `levers`: the recipe's levers
    re-decided for the target (those whose value changes are edits; graph_trainer.enable always)."""
    o, t = plan.chosen, plan.target
    where = f"plan for {t.kind}:{t.count}"
    s = o.sharding
    e: list[RecipeEdit] = []
    if ws.twin_path is not None:
        full = f"{where}: the full model (the gates ran its twin, twin.json)"
        e.append(RecipeEdit("model.hf_config", HF_CONFIG, full))
    batch_why = f"{where}: the largest per-device batch that fits {format_bytes(t.budget)}"
    if s.tp > 1:
        batch_why += f" (per TP group of {s.tp})"
    e += [
        RecipeEdit("training.batch_size", o.batch, batch_why),
        RecipeEdit(
            "training.seq_len",
            plan.seq_len,
            f"{where}"
            + (
                f": seq {plan.seq_len_asked} does not fit (see onboard plan)"
                if plan.seq_len != plan.seq_len_asked
                else ": --seq"
            ),
        ),
        RecipeEdit("training.dtype", "float32", f"{where}: fp32 master weights and AdamW state"),
        RecipeEdit(
            "training.mixed_precision_param",
            "float32" if t.device_type == "cpu" else "bfloat16",
            f"{where}: the compute dtype the memory model assumes",
        ),
        RecipeEdit("training.mixed_precision_reduce", "float32", f"{where}: gradients reduced in fp32"),
        RecipeEdit(
            "parallelism.data_parallel",
            o.data_parallel,
            f"{where}: "
            + (
                "FSDP2 gathers one block at a time"
                if o.data_parallel == "fsdp2"
                else "SimpleFSDP (the captured step and TP compose with it)"
            ),
        ),
        RecipeEdit("parallelism.dp_shard", s.dp_shard, f"{where}: {s.name}"),
        RecipeEdit("parallelism.dp_replicate", s.dp_replicate, f"{where}: {s.name}"),
        RecipeEdit("parallelism.tp", s.tp, f"{where}: {s.name}"),
        RecipeEdit("parallelism.sequence_parallel", False, f"{where}: the memory model does not count it"),
    ]
    e += [RecipeEdit(lv.key, lv.plan, f"{where}: {lv.why}") for lv in levers
          if lv.changed or lv.key == "graph_trainer.enable"]  # fmt: skip
    if o.policy != "none":
        e.append(RecipeEdit("graph_trainer.memory_policy", o.policy, f"{where}: the mildest policy that fits"))
        e.append(RecipeEdit("graph_trainer.split", plan.offload[0], f"{where}: {plan.offload[1]}"))
        e.append(RecipeEdit("graph_trainer.scan_layers", plan.scan[0], f"{where}: {plan.scan[1]}"))
    e.append(RecipeEdit("device.type", t.device_type, where))
    e.append(RecipeEdit("metrics.output_dir", f"runs/{plan_stem(plan)}", where))
    return e


def torchrun_line(ws: Workspace, plan, recipe: Path) -> str:
    t = plan.target
    nnodes = max(1, t.count // t.per_host)
    line = shlex.join([
        "torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={min(t.per_host, t.count)}", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=HEAD_NODE:{RDZV_PORT}", f"--rdzv-id={ws.name}-{t.name}", "-m", "titan_core.train",
        "--config", recipe.name,
    ])  # fmt: skip
    return f"cd {shlex.quote(str(ws.root))} && " + line.replace("HEAD_NODE:", "$HEAD_NODE:")


def stamped(text: str) -> str:
    """`text` under its STAMP line."""
    return f"{STAMP}{hashlib.sha256(text.encode()).hexdigest()}\n{text}"


def edited_since_planned(path: Path) -> bool:
    """Whether the file at `path` is not, byte for byte, what plan wrote there (its STAMP line no longer
    matches the rest, or it has none); False when nothing is there."""
    if not (path.exists() or path.is_symlink()):
        return False
    try:
        first, _, rest = path.read_bytes().partition(b"\n")
    except OSError:
        return True  # unreadable (a folder, a dangling link): not a file plan wrote
    digest = first.decode("utf-8", "replace").removeprefix(STAMP)
    return not first.startswith(STAMP.encode()) or digest != hashlib.sha256(rest).hexdigest()


def write_plan_recipe(
    ws: Workspace, plan, levers: list[Lever], *, force: bool = False
) -> tuple[Path, str, Path | None]:
    """Write recipe.<kind>-<count>.seq<seq>.toml (recipe.toml plus the planned edits); (path, torchrun line,
    where an edited file it replaced is kept). An edited one is BadInput without `force` (module docstring)."""
    path = ws.root / recipe_name(plan)
    edited = edited_since_planned(path)
    if edited and not force:
        raise BadInput(
            f"{path} was edited since `onboard plan` wrote it; pass --force to replace it (the edited one is then "
            f"kept as {path.name}{BACKUP_INFIX}<time>)"
        )
    text = ws.recipe_path.read_text()
    head = (
        f"# Planned by `onboard plan {ws.name} --target {plan.target.kind}:{plan.target.count} --seq "
        f"{plan.seq_len_asked}`: recipe.toml (every flag\n"
        "# the ladder earned) with the planned model, mesh, batch and memory policy. A prediction: no gate ran it\n"
        "# on the target (`--check` runs it 2 steps on the twin here). Levers earned only on the twin or this\n"
        "# machine are decided again for the target, each with its reason.\n"
        "# The plan assumes each rank materialises only its shard; titan_core's trainer today builds the whole fp32\n"
        "# model on every rank first, and its memory check refuses a model too large for that.\n"
    )
    try:
        text = edit_text(text, recipe_edits(ws, plan, levers))
    except RecipeEditError as e:
        raise BadInput(f"{ws.recipe_path}: the plan's settings cannot be written into it: {e}") from None
    backup = backup_aside(path) if edited else None
    atomic_write_text(path, stamped(head + text))
    return path, torchrun_line(ws, plan, path), backup


def plan_result(
    ws: Workspace, target_spec: str, *, seq: int = DEFAULT_SEQ, efficiency: float | None = None, force: bool = False
) -> dict:
    """Plan, write the recipe when something fits (an edited one replaced only with `force`), and return what
    the command prints (JSON-ready)."""
    plan, facts = plan_workspace_target(ws, target_spec, seq=seq, efficiency=efficiency)
    result: dict[str, Any] = {"workspace": ws.name, "model": facts["model"], "runs_on_twin": ws.twin_path is not None,
                              "tp_plan": facts["tp_plan"], **plan.to_dict(), "warnings": facts["warnings"],
                              "levers": [lv.to_dict() for lv in facts["levers"]]}  # fmt: skip
    if plan.chosen is not None:
        path, line, backup = write_plan_recipe(ws, plan, facts["levers"], force=force)
        result.update(recipe=str(path), torchrun=line, backup=str(backup) if backup else None)
    else:
        result.update(recipe=None, torchrun=None, backup=None)
    return result


SIZES = ("params", "grads", "optimizer", "gathered_params", "activations", "activations_host", "peak")
"""The per-device sizes of an option, in the plan table's column order (`<name>_bytes` of the option)."""


def plan_lines(r: dict) -> list[str]:
    """The plan as text: per-device bytes of every option, activations per policy, the decisions,
    the prediction, the recipe and the torchrun line."""
    t = r["target"]
    lines = [
        f"plan for {r['workspace']} ({r['model']}: {r['params_total']:,} parameters, {r['params_active']:,} active "
        f"per token) on {t['count']} x {t['kind']} ({format_bytes(t['memory_bytes'])} each: {t['memory_source']}; "
        f"the plan fills {t['headroom']:.0%}: {format_bytes(t['budget_bytes'])}), seq {r['seq_len']}"
        + (f" (asked {r['seq_len_asked']})" if r["seq_len"] != r["seq_len_asked"] else ""),
        "",
        "per device (PREDICTIONS from titan_core's memory model; batch = sequences per device, per TP group under TP):",
    ]
    head = ("sharding", "policy", "params", "grads", "optimizer", "gathered", "activations", "host", "peak", "batch")
    rows = [head] + [
        (
            o["sharding"],
            o["policy"],
            *(format_bytes(o[f"{k}_bytes"]) for k in SIZES),
            str(o["largest_batch"]) if o["largest_batch"] else "does not fit",
        )
        for o in r["options"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    if r["options_at_seq_asked"]:
        worst = min(r["options_at_seq_asked"], key=lambda o: o["peak_bytes"])
        lines.append(
            f"  at seq {r['seq_len_asked']} the smallest peak is {format_bytes(worst['peak_bytes'])} "
            f"({worst['sharding']}, policy {worst['policy']}, batch 1): nothing fits"
        )
    acts = ", ".join(f"{k} {format_bytes(v)}" for k, v in r["activations_per_token_per_layer"].items())
    lines += ["", f"activations per token per layer (saved for the backward; offload: on the host): {acts}"]
    c = r["chosen"]
    if c is None:
        lines += ["", "no option fits: no recipe written"]
    else:
        p = r["prediction"]
        lines += [
            "",
            f"chosen: {c['sharding']}, memory policy {c['policy']}, {c['data_parallel']}, batch {c['largest_batch']}",
            f"host offload with the graph splitter: {'needed' if r['offload_needed'] else 'not needed'} "
            f"({r['offload_why']})",
            f"scan over layers: {'recommended' if r['scan_needed'] else 'not needed'} ({r['scan_why']})",
            f"PREDICTED step time {p['step_time_s']:.3f} s, MFU {p['mfu']:.0%}, {p['tokens_per_s']:,.0f} tokens/s over "
            f"{t['count']} devices (roofline: {p['how']})",
            *_lever_lines(r["levers"]),
            f"recipe: {r['recipe']}",
            *([f"the edited recipe it replaced is kept as {r['backup']}"] if r.get("backup") else []),
            f"run it: {r['torchrun']}",
        ]
    lines += ["", *[f"note: {n}" for n in r["notes"]]]
    if "check" in r:
        lines += ["", *check_lines(r["check"])]
    return lines


def _lever_lines(levers: list[dict]) -> list[str]:
    """The recipe's levers as the plan decided them for the target, a line each."""
    if not levers:
        return []
    lines = ["levers re-decided for the target (the ladder earned them here, on this machine or the twin):"]
    for lv in levers:
        if lv["changed"]:
            lines.append(f"  {lv['key']}: {lv['recipe']!r} -> {lv['plan']!r} ({lv['why']})")
        else:
            lines.append(f"  {lv['key']}: {lv['plan']!r} kept ({lv['why']})")
    return lines
