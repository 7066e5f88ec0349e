"""`onboard plan NAME --target KIND[:COUNT] [--seq N]`: the full model of a workspace, planned for
the machine it will train on, and the recipe to run it there.

The arithmetic is onboard/sizing/plan/planner.py (the search over dp_shard, dp_replicate, tp, ep, cp and
pp, the per-device memory model, the step time with a term per collective). This module reads the
workspace: the full model of config.json (not the twin the gates ran) built on meta through
the recipe's [model] section, the levers the ladder earned in recipe.toml (re-decided for the
target where the twin's size or this machine earned them: onboard/sizing/plan/levers.py), and
writes `recipe.<kind>-<count>.seq<seq>.toml`: recipe.toml with every flag the ladder earned,
plus the planned model file, mesh (every degree), batch, microbatches, sequence, precision, memory
policy and execution mode, each line with its reason, and the `torchrun` line that runs it.
Nothing is allocated. Each candidate is the recipe it would write, judged by titan_core itself
(onboard/sizing/plan/accept.py): a combination titan_core refuses is never written, and the result
lists the refused ones with titan_core's reasons. The sequence is the one asked for: when nothing
titan_core accepts fits it, no recipe is written and the result's `error` is one line saying what
would (exit 1 in `onboard plan`).
`onboard plan --check` then runs that recipe on the twin (onboard/sizing/plan/check.py).

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
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from onboard.ladder.recipe_edit import RecipeEditError, edit_text
from onboard.errors import BadInput
from onboard.ladder.contract import RecipeEdit
from onboard.sizing.plan.planner import parse_target, plan_training
from onboard.sizing.plan.accept import Acceptance, planned_values
from onboard.sizing.plan.search import GLOBAL_TOKENS, Option
from onboard.sizing.plan.layout_memory import REGATHERING
from onboard.sizing.plan.check import check_lines
from onboard.sizing.plan.levers import Lever, planning_kernels
from onboard.workspace.fsutil import BACKUP_INFIX, atomic_write_text, backup_aside
from onboard.workspace.layout import HF_CONFIG, Workspace
from titan_core.config import ConfigError, load_config
from titan_core.config.hf_config import read_hf_config
from titan_core.config.execution_modes import execution_mode
from titan_core.memory.budget import cpu_budget
from titan_core.memory.estimate import ModelShape, format_bytes
from titan_core.models.common.param_counts import count_params
from titan_core.lora.inject import planned_lora_params
from titan_core.models.common.stats import flops_per_token
from titan_core.parallel.plans import TP_PLANS
from titan_core.runtime.argv import LAUNCH
from titan_core.runtime.cpu_peak import measured_cpu_peak
from titan_core.models.model_builder import build_meta_model, model_adapter, resolve_model_args

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
    lora = -1
    if cfg.lora.enable:  # the base frozen: the adapters alone hold gradients and AdamW state
        try:
            lora = planned_lora_params(model, cfg.lora, model_adapter(full))
        except ConfigError as e:
            raise BadInput(f"{ws.recipe_path}: {e}") from None
        shape = replace(shape, lora_params=lora)
    counts = count_params(model)
    tp_plan = full.family in TP_PLANS and not full.module_file
    twin_args = resolve_model_args(cfg.model) if ws.twin_path is not None else None
    kernels, levers = planning_kernels(cfg, args, target, twin_args=twin_args, scores_pinned=shape.scores_pinned)
    recipe = copy.deepcopy(cfg)
    recipe.model = full
    accept = Acceptance(recipe, args, model, shape, target, kernels, levers)
    plan = plan_training(
        shape, counts, lambda s: flops_per_token(args, s, lora_params=lora), target, seq_len=seq, kernels=kernels,
        tp_plan=tp_plan, efficiency=efficiency, compiled=execution_mode(cfg) == "compile",
        captured_compiled=cfg.graph_trainer.compile == "inductor",
        float8=getattr(cfg.kernels, "float8", "none") != "none", accept=accept,
    )  # fmt: skip
    refused_features: dict[str, str] = {}
    if plan.chosen is not None:
        levers = accept.levers_for(plan.chosen, **_mode_refusals(plan.options, plan.chosen))
        refused_features = accept.refused_features(plan.chosen)
        _state_refused_features(plan, refused_features)
    facts = {"family": full.family, "tp_plan": tp_plan, "layers": args.n_layers, "model": _model_file(ws),
             "levers": levers, "warnings": seq_warnings(ws, args, plan),
             "refused_features": refused_features}  # fmt: skip
    return plan, facts


def _mode_refusals(options: list[Option], chosen: Option) -> dict[str, str | None]:
    """titan_core's refusals of the chosen eager layout in the other modes, for the mode levers' reasons:
    compiled per block (when the plan runs it uncompiled) and captured (the fastest refused policy)."""
    if chosen.captured:
        return {}
    same = [o for o in options if o.layout == chosen.layout and o.fits and o.refused]
    compiled = next((o.refused for o in same if o.policy == chosen.policy and o.compile
                     and o.data_parallel == chosen.data_parallel), None) if not chosen.compile else None  # fmt: skip
    captured = max((o for o in same if o.captured), key=lambda o: o.tokens_per_s, default=None)
    return {"compile_refused": compiled, "captured_refused": captured.refused if captured else None}


def _state_refused_features(plan, refused: dict[str, str]) -> None:
    """Say in the notes (and in pp's reason, whose recipe it concerns most) which training features the
    chosen layout's recipe cannot turn on: titan_core refuses them with it."""
    for key, why in refused.items():
        plan.notes.append(f"the recipe leaves {key} off, and with this layout it must: titan_core refuses it ({why})")
    if plan.chosen.layout.pp > 1 and refused:
        what = "saves no checkpoints" if "checkpoint.enable" in refused else "runs without them"
        plan.reasons["pp"] = plan.reasons.get("pp", "") + (
            f"; with it titan_core refuses {', '.join(refused)} (this recipe leaves "
            f"{'it' if len(refused) == 1 else 'them'} off): a run of this recipe {what}"
        )


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
    """A warning when the sequence asked for is longer than the model declares it handles."""
    limit = max_positions(ws, args)
    if limit is None or plan.seq_len <= limit[0]:
        return []
    return [
        f"--seq {plan.seq_len} exceeds {limit[1]} ({limit[0]}): positions past it were never "
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
    batch_why = f"{where}: the largest per-device batch that fits {format_bytes(t.budget)}"
    if o.batch < o.largest_batch:
        batch_why = (f"{where}: {o.largest_batch} fit {format_bytes(t.budget)}; {o.batch} keeps the global batch "
                     f"within {GLOBAL_TOKENS:,} tokens")  # fmt: skip
    if s.tp > 1:
        batch_why += f" (per TP group of {s.tp})"
    why = {d: f"{where}: {plan.reasons.get(d, s.name)}" for d in ("tp", "ep", "cp", "pp", "dp_replicate")}
    micro_why = (f"{where}: PP's microbatches, {o.microbatches // s.pp} per stage" if s.pp > 1
                 else f"{where}: one microbatch per step")  # fmt: skip
    dp_why = {"fsdp2": "FSDP2 gathers one block at a time",
              REGATHERING: "SimpleFSDP gathering each weight again for its backward (eager)"}.get(
        o.data_parallel, "SimpleFSDP (the captured step, TP, EP and PP compose with it)")  # fmt: skip
    reasons = {
        "training.batch_size": batch_why, "training.seq_len": f"{where}: --seq", "training.grad_accum": micro_why,
        "training.dtype": f"{where}: fp32 master weights and AdamW state",
        "training.mixed_precision_param": f"{where}: the compute dtype the memory model assumes",
        "training.mixed_precision_reduce": f"{where}: gradients reduced in fp32",
        "parallelism.data_parallel": f"{where}: {dp_why}", "parallelism.dp_shard": f"{where}: {s.name}",
        "parallelism.reshard_after_forward": f"{where}: {dp_why}" if o.data_parallel == REGATHERING else
        f"{where}: the memory model counts the gathered weights as {o.data_parallel} keeps them",
        **{f"parallelism.{d}": why[d] for d in why},
        "parallelism.sequence_parallel": f"{where}: the memory model does not count it",
        "parallelism.pp_schedule": f"{where}: the schedule the plan predicts with",
        **{lv.key: f"{where}: {lv.why}" for lv in levers},
        "graph_trainer.memory_policy": f"{where}: {plan.why_chosen}",
        "activation_checkpoint.mode": f"{where}: {plan.why_chosen}",
        "activation_checkpoint.selective": f"{where}: keep the matmul and attention outputs, recompute the rest",
        "graph_trainer.split": f"{where}: {plan.offload[1]}", "graph_trainer.scan_layers": f"{where}: {plan.scan[1]}",
        "device.type": where,
    }  # fmt: skip
    # the values are the ones titan_core judged for this option (plan_accept.planned_values): one source
    values = planned_values(o, t, plan.seq_len, levers, offload=plan.offload[0], scan=plan.scan[0])
    e: list[RecipeEdit] = []
    if ws.twin_path is not None:
        full = f"{where}: the full model (the gates ran its twin, twin.json)"
        e.append(RecipeEdit("model.hf_config", HF_CONFIG, full))
    e += [RecipeEdit(key, value, reasons[key]) for key, value in values.items()]
    e.append(RecipeEdit("metrics.output_dir", f"runs/{plan_stem(plan)}", where))
    return e


def torchrun_line(ws: Workspace, plan, recipe: Path) -> str:
    t = plan.target
    nnodes = max(1, t.count // t.per_host)
    line = shlex.join([
        *LAUNCH, f"--nnodes={nnodes}", f"--nproc-per-node={min(t.per_host, t.count)}", "--rdzv-backend=c10d",
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
                              "levers": [lv.to_dict() for lv in facts["levers"]],
                              "refused_features": facts["refused_features"]}  # fmt: skip
    if plan.chosen is not None:
        path, line, backup = write_plan_recipe(ws, plan, facts["levers"], force=force)
        result.update(recipe=str(path), torchrun=line, backup=str(backup) if backup else None)
    else:  # the sequence asked for is kept: nothing is written, and one line says what would fit
        result.update(recipe=None, torchrun=None, backup=None, error=plan.would_fit)
    return result


SIZES = ("params", "grads", "optimizer", "gathered_params", "activations", "activations_host", "peak")
"""The per-device sizes of an option, in the plan table's column order (`<name>_bytes` of the option)."""


def plan_lines(r: dict) -> list[str]:
    """The plan as text: the most promising options' per-device bytes and predictions, activations per policy,
    the chosen layout with why each degree has its value, the step's compute and communication, the recipe
    and the torchrun line. When nothing fits: the one line saying what would (also the command's error)."""
    t = r["target"]
    lines = [
        f"plan for {r['workspace']} ({r['model']}: {r['params_total']:,} parameters, {r['params_active']:,} active "
        f"per token) on {t['count']} x {t['kind']} ({format_bytes(t['memory_bytes'])} each: {t['memory_source']}; "
        f"the plan fills {t['headroom']:.0%}: {format_bytes(t['budget_bytes'])}), seq {r['seq_len']}",
    ]
    if r["chosen"] is None:
        return lines + ["", f"no layout fits: no recipe written. {r['error']}"]
    lines += [
        "",
        f"per device, the {len(r['options'])} fastest of {r['options_accepted']} fitting options titan_core accepts "
        f"({r['options_tried']} tried; PREDICTIONS; batch = sequences per microbatch per data-parallel rank):",
    ]
    head = ("layout", "mode", "policy", "params", "grads", "optimizer", "gathered", "activations", "host", "peak",
            "batch", "tokens/s/dev")  # fmt: skip
    rows = [head] + [
        (o["sharding"], o["mode"], o["policy"], *(format_bytes(o[f"{k}_bytes"]) for k in SIZES), str(o["batch"]),
         f"{o['predicted_tokens_per_s_device']:,.0f}")
        for o in r["options"][:10]
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    lines += _refused_lines(r["refused"])
    acts = ", ".join(f"{k} {format_bytes(v)}" for k, v in r["activations_per_token_per_layer"].items())
    lines += ["", f"activations per token per layer (saved for the backward; offload: on the host): {acts}"]
    c, p = r["chosen"], r["prediction"]
    lines += [
        "",
        f"chosen: {c['sharding']}, {c['mode']}, memory policy {c['policy']}, {c['data_parallel']}, batch {c['batch']}, "
        f"{c['grad_accum']} microbatch(es), global batch {r['global_batch_tokens']:,} tokens",
        f"  why: {r['why_chosen']}",
        "  largest batch of this layout per mode and memory policy: " + "; ".join(
            f"{mode} " + ", ".join(f"{p} {b}" for p, b in pols.items())
            for mode, pols in r["largest_batch_by_policy"].items()),
        *[f"  {why}" for why in r["degrees_why"].values()],
        f"host offload with the graph splitter: {'needed' if r['offload_needed'] else 'not needed'} "
        f"({r['offload_why']})",
        f"scan over layers: {'recommended' if r['scan_needed'] else 'not needed'} ({r['scan_why']})",
        f"PREDICTED step time {p['step_time_s']:.3f} s, MFU {p['mfu']:.0%}, {p['tokens_per_s_device']:,.0f} tokens/s "
        f"per device, {p['tokens_per_s']:,.0f} over {t['count']} devices",
        f"  compute {p['compute_s']:.3f} s ({p['how']})",
        *[f"  {cm['name']}: {format_bytes(cm['bytes'])} over {cm['link']} at "
          f"{format_bytes(cm['bandwidth_bytes_per_s'])}/s, {cm['seconds']:.3f} s, {cm['exposed_seconds']:.3f} s exposed "
          f"({cm['overlap']})" for cm in p["comm"]],
        *_lever_lines(r["levers"]),
        f"recipe: {r['recipe']}",
        *([f"the edited recipe it replaced is kept as {r['backup']}"] if r.get("backup") else []),
        f"run it: {r['torchrun']}",
    ]  # fmt: skip
    lines += ["", *[f"note: {n}" for n in r["notes"]]]
    if "check" in r:
        lines += ["", *check_lines(r["check"])]
    return lines


def _refused_lines(refused: dict, limit: int = 5) -> list[str]:
    """The fitting options titan_core refused, by reason (the most frequent `limit`); --json has them all."""
    if not refused["options"]:
        return []
    lines = [f"titan_core refuses {refused['options']} fitting option(s) as their recipes would be written "
             "(never chosen), most often:"]  # fmt: skip
    lines += [f"  {g['count']} x {g['reason']} (fastest: {g['fastest']})" for g in refused["reasons"][:limit]]
    if len(refused["reasons"]) > limit:
        lines.append(f"  and {len(refused['reasons']) - limit} other reason(s) (--json lists them)")
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
