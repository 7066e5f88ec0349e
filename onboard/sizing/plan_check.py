"""`onboard plan --check`: does the recipe a plan wrote run? Loaded as a config, then two steps on
the workspace's twin on this CPU, with the combination it sets.

A plan is a prediction for a machine that is not here, but its recipe is a combination of levers
(execution mode, kernels, precision, data-parallel kind) that must hold together: titan_core
refuses two execution modes at once, and a combination can be non-finite at step 1 in its
precision. So the check takes the plan's recipe as written (the loader's types and range
checks), and runs it on the model the gates ran (the twin, or the full model when it fits here)
for CHECK_STEPS steps, changing only what cannot hold on one CPU process, each change listed:

- the device (cpu), one process (every degree of the mesh 1: dp_shard, dp_replicate, tp, ep, cp, pp;
  no sequence parallelism), this CPU's threads;
- at most the gates' batch, microbatches and sequence (recipe.toml's: the twin's, short on a CPU);
- a kernel that cannot run here (a TPU's splash attention, tokamax without the [jax] extra,
  torch._grouped_mm traced in fp32) is replaced by the path the gates verified (sdpa; the dense
  experts in a compiled or captured step, the loop otherwise): that lever is not checked here;
- nothing saved, exported or profiled; output under runs/plan-check/<target>.seqN.

Then, when the plan sets tp, ep, cp or pp above 1, the same run again on a gloo mesh of this CPU's
processes with each of them at 2 (together, as the recipe combines them; ep on 2 data-parallel
ranks, since it is carved from dp_shard x cp), CHECK_STEPS steps, finite or not: a combination
titan_core refuses fails the check with its message, as on the target it would fail the run.

Everything else runs as the recipe says: the execution mode and its settings (compile backend,
memory policy, scan, split), the dtypes, the kernels, the optimizer. The outcome: whether the
recipe loads, whether titan_core accepted the combination (its refusal, if not), and each
step's loss and grad norm, all finite or not.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

from onboard.rungs import gate_recipe, train_run
from onboard.rungs.kernel_compare import applicable_kernels
from onboard.rungs.parallel_degrees import share_cores
from onboard.workspace.layout import Workspace
from titan_core.config import ConfigError, load_config
from titan_core.config.loader import get_key, set_key
from titan_core.models.common.mapping_errors import KernelUnavailable
from titan_core.parallel import check_parallelism
from titan_core.parallel.pipeline import STAGES_PER_RANK
from titan_core.runtime import launcher
from titan_core.training.model_builder import build_meta_model

CHECK_STEPS = 2
"""Steps the check runs: step 1 runs the plan's combination on fresh weights, step 2 on weights the
optimizer has updated once (a non-finite update shows there)."""
DEGREES = ("tp", "ep", "cp", "pp")
"""The plan's degrees the check runs at 2 on gloo (data parallelism is what the gates ran already)."""
DEGREES_TIMEOUT_S = 600.0
"""A multi-process check that takes longer ends as failed, never a hung command."""
CPU_STAND_IN = {"attention": "sdpa"}
"""The path a kernel field falls back to on this CPU when the plan's kernel cannot run here
(experts: `_moe_stand_in`, which depends on the execution mode)."""


def check_plan_recipe(ws: Workspace, recipe_path: Path) -> dict[str, Any]:
    """Load the plan's recipe and run it on the gates' model here (module docstring); JSON-ready."""
    out: dict[str, Any] = {"recipe": str(recipe_path), "steps": CHECK_STEPS, "loads": False, "refused": None,
                           "changed_here": [], "rows": [], "finite": False, "ok": False}  # fmt: skip
    try:
        planned = load_config(recipe_path)
    except ConfigError as e:
        out["refused"] = f"the recipe does not load: {e}"
        return out
    out["loads"] = True
    cfg, changes = cpu_run_config(ws, planned)
    out.update(model=ws.model_label(), mode=_mode(cfg), precision=gate_recipe.precision(cfg.training),
               changed_here=changes)  # fmt: skip
    start = time.perf_counter()
    try:
        with train_run.process_threads(), train_run.quiet_mesh_pickling():
            result = train_run.build_trainer(cfg).train()
    except (ConfigError, KernelUnavailable) as e:  # titan_core refuses the combination (two modes at once, ...)
        out["refused"] = " ".join(str(e).split())
        return out
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["rows"] = [{"step": r["step"], "loss": r["loss"], "grad_norm": r["grad_norm"]} for r in result.metrics]
    out["stopped"] = result.stopped
    out["finite"] = len(out["rows"]) == CHECK_STEPS and all(
        math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in out["rows"]
    )
    out["ok"] = out["finite"]
    if out["ok"] and degrees_needed(planned):
        out["degrees"] = check_degrees(cfg, planned)
        out["ok"] = out["degrees"]["finite"]
    return out


def degrees_needed(planned) -> list[str]:
    """The plan's degrees beyond data parallelism that are above 1, e.g. ["ep"]."""
    return [n for n in DEGREES if getattr(planned.parallelism, n) > 1]


def check_degrees(cfg, planned) -> dict[str, Any]:
    """The one-process check's run again with the plan's degrees at 2 on gloo (module docstring)."""
    names = degrees_needed(planned)
    run, rp = copy.deepcopy(cfg), planned.parallelism
    p = run.parallelism
    p.dp_replicate, p.dp_shard, p.sequence_parallel = 1, -1, rp.sequence_parallel and "tp" in names
    p.pp_schedule, p.pp_layers = rp.pp_schedule, []
    for n in names:
        setattr(p, n, 2)
    dp = 2 if "ep" in names and "cp" not in names else 1
    world = dp * math.prod(2 for n in names if n in ("tp", "cp", "pp"))
    notes = [f"{', '.join(f'{n} = 2' for n in names)} on {world} processes (plan: "
             f"{', '.join(f'{n} = {getattr(rp, n)}' for n in names)})"]  # fmt: skip
    run.training.batch_size = max(1, cfg.training.batch_size // dp)
    layers = gate_recipe.model_args(run).n_layers
    if "pp" in names and 2 * STAGES_PER_RANK[p.pp_schedule] > layers:
        p.pp_schedule = "1F1B"
        stages = 2 * STAGES_PER_RANK[rp.pp_schedule]
        notes.append(f"parallelism.pp_schedule 1F1B (plan: {rp.pp_schedule}): its {stages} stages at pp = 2 need as "
                     f"many layers, and the model run here has {layers}")  # fmt: skip
    if "pp" in names and run.training.grad_accum < 2:
        run.training.grad_accum = 2
        notes.append("training.grad_accum 2: a pipeline of 2 stages needs 2 microbatches at least")
    if "cp" in names and run.training.seq_len % 4:
        run.training.seq_len = max(4, run.training.seq_len - run.training.seq_len % 4)
        notes.append(f"training.seq_len {run.training.seq_len}: cp = 2 cuts each row into 4 equal chunks")
    run.metrics.output_dir = str(Path(cfg.metrics.output_dir).with_name(Path(cfg.metrics.output_dir).name + "-degrees"))
    share_cores(run, world)
    out: dict[str, Any] = {"degrees": {n: 2 for n in names}, "world_size": world, "notes": notes, "refused": None,
                           "rows": [], "finite": False}  # fmt: skip
    try:
        check_parallelism(run, world)
        result = launcher.run_world(run, world, timeout_s=DEGREES_TIMEOUT_S)
    except ConfigError as e:
        out["refused"] = " ".join(str(e).split())
        return out
    out["rows"] = [{"step": r["step"], "loss": r["loss"], "grad_norm": r["grad_norm"]} for r in result.metrics]
    if not result.ok:
        out["refused"] = (result.launch.failure or f"exit code {result.launch.exit_code}").splitlines()[0]
    out["finite"] = result.ok and len(out["rows"]) == CHECK_STEPS and all(
        math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in out["rows"]
    )
    return out


def cpu_run_config(ws: Workspace, planned) -> tuple[Any, list[dict[str, Any]]]:
    """(the plan's config as the check runs it here, each value changed: {key, plan, here, why})."""
    gates = load_config(ws.recipe_path)
    cfg = copy.deepcopy(planned)
    changes: list[dict[str, Any]] = []

    def put(key: str, value: Any, why: str) -> None:
        was = get_key(cfg, key)
        if was != value:
            set_key(cfg, key, value)
            changes.append({"key": key, "plan": was, "here": value, "why": why})

    put("model.hf_config", gates.model.hf_config, "the model the gates ran (the twin when the full model "
        "does not fit here)")
    put("device.type", "cpu", "this machine")
    put("device.threads", 0, "this CPU's own threads")
    for key in ("parallelism.dp_shard", "parallelism.dp_replicate", "parallelism.tp", "parallelism.ep",
                "parallelism.cp", "parallelism.pp"):  # fmt: skip
        put(key, 1, "one process here")
    put("parallelism.sequence_parallel", False, "one process here")
    put("training.batch_size", min(cfg.training.batch_size, gates.training.batch_size), "the gates' batch at most")
    put("training.grad_accum", min(cfg.training.grad_accum, gates.training.grad_accum),
        "the gates' microbatches at most (the plan's are PP's, and PP is 1 here)")
    put("training.seq_len", min(cfg.training.seq_len, gates.training.seq_len), "the gates' sequence at most")
    cfg.training.steps = CHECK_STEPS
    cfg.checkpoint.enable, cfg.checkpoint.export_hf, cfg.profiler.enable = False, "", False
    cfg.metrics.output_dir = str(ws.runs_dir / "plan-check" / Path(cfg.metrics.output_dir).name)
    cfg.metrics.rich = False
    cfg.metrics.log_freq = 1
    for key, value, why in _cpu_kernels(cfg):
        put(key, value, why)
    return cfg, changes


def _cpu_kernels(cfg) -> list[tuple[str, str, str]]:
    """(key, stand-in, why) for each of the recipe's kernels that cannot run on this CPU."""
    args = gate_recipe.model_args(cfg)
    captured = cfg.compile.enable or cfg.graph_trainer.enable
    refusals = applicable_kernels(args, device="cpu", dtype=gate_recipe.compute_dtype(cfg.training), captured=captured,
                                  model=build_meta_model(cfg.model, args))  # fmt: skip
    out = []
    for field_name in ("attention", "moe"):
        value = getattr(cfg.kernels, field_name)
        why = refusals.get(f"kernels.{field_name}={value}")
        if why:
            stand_in = _moe_stand_in(captured) if field_name == "moe" else CPU_STAND_IN[field_name]
            out.append((f"kernels.{field_name}", stand_in, f"not checked here: {why}"))
    return out


def _moe_stand_in(captured: bool) -> str:
    """The experts the gates verified in this execution mode: dense where shapes must be static."""
    return "dense" if captured else "loop"


def _mode(cfg) -> str:
    if cfg.compile.enable and cfg.graph_trainer.enable:
        return "compile + graph_trainer"
    if cfg.graph_trainer.enable:
        return f"graph_trainer (memory policy {cfg.graph_trainer.memory_policy})"
    return f"compile ({cfg.compile.backend})" if cfg.compile.enable else "eager"


def check_lines(c: dict[str, Any]) -> list[str]:
    """The check as text."""
    head = f"check of {c['recipe']}:"
    if not c["loads"] or (c["refused"] and "mode" not in c):
        return [head, f"  FAILED: {c['refused']}"]
    lines = [head, f"  ran {c['model']} on this CPU, {c['mode']}, {c['precision']}, {c['steps']} steps"]
    lines += [f"  here {ch['key']} = {ch['here']!r} (plan: {ch['plan']!r}): {ch['why']}" for ch in c["changed_here"]
              if ch["key"] != "model.hf_config"]  # fmt: skip
    if c["refused"]:
        return lines + [f"  FAILED: titan_core refused the combination: {c['refused']}"]
    lines += [f"  step {r['step']}: loss {r['loss']!r}, grad norm {r['grad_norm']!r}" for r in c["rows"]]
    if not c["finite"]:
        return lines + [f"  FAILED: not finite ({c['stopped']})"]
    lines.append("  finite: every step's loss and grad norm")
    d = c.get("degrees")
    if d:
        lines += [f"  then {note}" for note in d["notes"]]
        if d["refused"]:
            return lines + [f"  FAILED: {d['refused']}"]
        lines += [f"  step {r['step']}: loss {r['loss']!r}, grad norm {r['grad_norm']!r}" for r in d["rows"]]
        lines.append("  finite: every step's loss and grad norm" if d["finite"] else "  FAILED: not finite")
    return lines
