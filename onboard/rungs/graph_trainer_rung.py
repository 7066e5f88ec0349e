"""Rung 5, `graph_trainer`: the whole train step (forward, loss, backward, clipping, AdamW)
captured as one graph that runs without the host waiting on the device, and exactly
eager's arithmetic when it runs uncompiled (DESIGN sections 1, 5 and 6).

Three parts, all in this process:

1. probe (tracing only, weights untouched): every host sync the step would make
   (`find_host_syncs`), and the saved-activation bytes of each memory policy;
2. exactness: the recipe for the checklist's `exact_steps` eagerly and as a captured step run
   uncompiled (`graph_trainer.compile = "none"`, unsplit, numerics-preserving passes
   only), both deterministic: losses, grad norms, parameters and AdamW state `torch.equal`;
   programs launched per step and captures per run;
3. speed: the recipe's own `[graph_trainer]` settings (compile, memory policy, scan,
   split) for `timed_steps` steps: trace, pass and backend compile time, step time and
   peak memory, beside the eager and compile rungs'.

A MoE recipe with the reference loop experts runs with `kernels.moe = "dense"` (see
harness.DENSE_WHY), in the eager and the captured run alike.
"""

from __future__ import annotations

import gc

from onboard.rungs import execution_mode, harness
from onboard.rungs.contract import RungContext, RungResult

RUNG = "graph_trainer"
reads_recipe_key = harness.reads_all_but_mode


def compare_runs(eager_tr, eager_rows, graph_tr, graph_rows) -> dict:
    """Exactness of the captured run against the eager one: bit equality and, when it fails, where."""
    import torch

    from titan_core.parallel import local_tensor as _local

    losses = [r["loss"] for r in graph_rows] == [r["loss"] for r in eager_rows]
    norms = [r["grad_norm"] for r in graph_rows] == [r["grad_norm"] for r in eager_rows]
    worst_param, worst_diff, params_equal, state_equal = None, 0.0, True, True
    eager_named = dict(eager_tr.model.named_parameters())
    for name, q in graph_tr.model.named_parameters():
        a, b = _local(eager_named[name].detach()), _local(q.detach())
        if not torch.equal(a, b):
            params_equal = False
            diff = (a.double() - b.double()).abs().max().item()
            if diff >= worst_diff:
                worst_param, worst_diff = name, diff
        se, sg = eager_tr.optimizer.state[eager_named[name]], graph_tr.optimizer.state[q]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key in se and key in sg and not torch.equal(_local(se[key]), _local(sg[key])):
                state_equal = False
    loss_diff = max((abs(a["loss"] - b["loss"]) for a, b in zip(graph_rows, eager_rows)), default=0.0)
    return {
        "bit_identical": losses and norms and params_equal and state_equal and len(graph_rows) == len(eager_rows),
        "losses_equal": losses,
        "grad_norms_equal": norms,
        "params_equal": params_equal,
        "optimizer_state_equal": state_equal,
        "loss_max_abs_diff": loss_diff,
        "params_max_abs_diff": worst_diff,
        "first_differing_param": worst_param,
    }


def probe(ctx: RungContext, cfg) -> tuple[dict, dict]:
    """Host syncs and memory-policy bytes of the captured step, by tracing a fresh model."""
    from titan_core.compile.graph_trainer import CaptureError, find_host_syncs, measure_memory_policies

    trainer = harness.build_trainer(cfg)
    try:
        batches = [next(trainer.data) for _ in range(cfg.training.grad_accum)]
        ctx.log("graph_trainer: tracing the step to look for host syncs")
        try:
            syncs = find_host_syncs(trainer.model, trainer.optimizer, batches, max_norm=cfg.training.max_norm)
        except CaptureError as e:
            return {"captured": False, "capture_error": str(e)}, {}
        m = {
            "host_syncs": len(syncs),
            "first_host_sync": f"{syncs[0].op}: {syncs[0].why} at {syncs[0].where or '?'}" if syncs else None,
        }
        details = {"host_syncs": [{"op": s.op, "why": s.why, "where": s.where} for s in syncs]}
        if syncs:
            return m, details
        ctx.log("graph_trainer: saved activations under each memory policy (tracing only)")
        policies = measure_memory_policies(
            trainer.model, trainer.optimizer, batches, max_norm=cfg.training.max_norm,
            scan_layers=cfg.graph_trainer.scan_layers,
        )  # fmt: skip
        for name, b in policies.items():
            m[f"saved_activation_bytes_{name}"] = b.device
            if b.host:
                m[f"saved_activation_host_bytes_{name}"] = b.host
        return m, details
    finally:
        trainer.close()


def run(ctx: RungContext) -> RungResult:
    from titan_core.compile.graph_trainer import CaptureError, HostSyncError

    from titan_core.measure.numerics import rel

    base = harness.job_config(ctx)
    args = harness.model_args(base)
    moe, moe_why = harness.capture_moe(base, args)
    exact_steps, timed_steps = harness.param(RUNG, "exact_steps"), harness.param(RUNG, "timed_steps")
    out = ctx.attempt_dir
    gt = base.graph_trainer
    flags = ["--graph_trainer.enable=true"] + ([f"--kernels.moe={moe}"] if moe else [])
    common = {"moe": moe}
    ctx.log(
        f"graph_trainer: capture the whole step of {args.n_layers} blocks"
        + ("; MoE experts: kernels.moe = dense (the recipe's loop syncs the host; measurements.moe_why)" if moe else "")
    )
    m, details = probe(ctx, harness.mode_config(base, out / "probe", steps=1, **common))
    m.update(moe_experts=moe or (base.kernels.moe if args.n_experts else None), moe_why=moe_why, flags=" ".join(flags))
    files = harness.files_read(ctx, base)
    command = harness.next_step_command(ctx)
    if m.get("captured") is False or m.get("host_syncs"):
        m.setdefault("captured", True)  # a sync was found while tracing, which did capture the rest
        ctx.log(f"graph_trainer: not run: {m.get('capture_error') or m['first_host_sync']}")
        return RungResult(measurements=m, files_read=files, command=command, details=details)

    exact = {"enable": True, "compile": "none", "numerics_changing": False, "split": False}
    e_cfg = harness.mode_config(base, out / "eager", steps=exact_steps, deterministic=True, **common)
    g_cfg = harness.mode_config(
        base, out / "exact", steps=exact_steps, deterministic=True, graph_trainer=exact, **common
    )
    for cfg in (e_cfg, g_cfg):
        if harness.resolved_device_type(cfg.device.type) == "cpu":
            # once here, on a loaded machine, eager and the captured step (2 threads each) ended
            # 3e-5 apart in layers.0.attention.wk after 3 steps, and never again when idle: a
            # threaded kernel's summation order is not promised across runs; one thread fixes
            # it, so equal means equal and a difference is the capture's
            cfg.device.threads = 1
    e_tr, e_res = harness.train(ctx, e_cfg, "graph_trainer: eager reference")
    try:
        g_tr, g_res = harness.train(ctx, g_cfg, "graph_trainer: captured step, uncompiled")
    except (CaptureError, HostSyncError) as e:
        m.update(captured=False, capture_error=str(e))
        return RungResult(measurements=m, files_read=files, command=command, details=details)
    stats = g_tr.graph_step.stats
    m.update(
        captured=True,
        captures_per_run=stats.captures,
        graphs_per_step=max(stats.programs_per_step),
        exact_steps=exact_steps,
        **compare_runs(e_tr, e_res.metrics, g_tr, g_res.metrics),
    )
    m["eager_step1_loss_rel_err"] = rel(g_res.metrics[0]["loss"], harness.eager_step1_loss(ctx))
    passes = [{"name": p.name, "nodes_before": p.nodes_before, "nodes_after": p.nodes_after} for p in stats.pass_records]
    exact_curve, eager_curve = [r["loss"] for r in g_res.metrics], [r["loss"] for r in e_res.metrics]
    del e_tr, g_tr  # their models and optimizer state would inflate the timed run's peak memory
    gc.collect()

    timed_sections = {"enable": True}
    t_cfg = harness.mode_config(base, out / "timed", steps=timed_steps, graph_trainer=timed_sections, **common)
    ctx.log(
        f"graph_trainer: timed run with the recipe's settings: compile {gt.compile}, memory policy "
        f"{gt.memory_policy}, scan_layers {gt.scan_layers}, split {gt.split}"
    )
    t_tr, t_res = harness.train(ctx, t_cfg, "graph_trainer: timed")
    rows, ts = t_res.metrics, t_tr.graph_step.stats
    m.update(
        graph_compile=gt.compile,
        memory_policy=gt.memory_policy,
        scan_layers=gt.scan_layers,
        split=gt.split,
        timed_programs_per_step=max(ts.programs_per_step),
        trace_time_s=ts.trace_time_s,
        passes_time_s=ts.passes_time_s,
        backend_compile_time_s=ts.compile_time_s,
        compile_time_s=ts.trace_time_s + ts.passes_time_s + ts.compile_time_s,
        first_step_time_s=rows[0]["step_time_s"],
        **harness.run_stats(rows),
    )
    harness.beside_eager(m, ctx.evidence)
    step_time = m["step_time_median_s"]
    compiled = ctx.evidence.get("compile") or {}
    if compiled.get("step_time_median_s"):
        m["compile_rung_step_time_median_s"] = compiled["step_time_median_s"]
        m["speedup_vs_compile_rung"] = compiled["step_time_median_s"] / step_time
    ctx.log(
        f"graph_trainer: {m['graphs_per_step']} program per step, {m['host_syncs']} host syncs, "
        f"{'bit-identical' if m['bit_identical'] else 'NOT bit-identical'} to eager over {exact_steps} steps; "
        f"{step_time * 1e3:.0f} ms/step with compile={gt.compile}; {m['vs_eager_text']}"
    )
    details.update(
        device=t_res.device,
        gate_overrides=harness.gate_overrides(ctx, t_cfg),
        loss_curve=[r["loss"] for r in rows],
        exact_loss_curve=exact_curve,
        eager_loss_curve=eager_curve,
        passes=passes,
        metrics_files={k: ctx.workspace.key_for(out / k / "metrics.jsonl") for k in ("eager", "exact", "timed")},
        reproduce=harness.train_command(ctx, flags),
    )
    del t_tr
    gc.collect()
    edits = []
    if m["bit_identical"] and m["graphs_per_step"] == 1 and m["captures_per_run"] == 1:
        # part 4: the recipe's execution mode, among the modes whose checks held
        modes = ["eager"] + (["compile"] if "compile" in ctx.evidence else []) + ["graph_trainer"]
        edits, record = execution_mode.choose(ctx, base, rung=RUNG, moe=moe, modes=modes)
        m.update(execution_mode=record["execution_mode"], execution_mode_why=record["execution_mode_why"])
        # a memory policy trades compute for memory: it earns its place only when memory binds,
        # which the gate's small batch never shows; the recipe's policy stays, said so
        saved = {k.removeprefix("saved_activation_bytes_"): v for k, v in m.items() if k.startswith("saved_activation_bytes_")}
        m["memory_policy_choice"] = gt.memory_policy
        m["memory_policy_why"] = (
            f"kept the recipe's {gt.memory_policy!r}: saved activations per policy {saved} bytes; at the gate's "
            "batch no memory budget binds, so recomputing would only cost time"
        )
        details["execution_mode"] = record
        ctx.log(f"graph_trainer: the recipe's execution mode: {record['execution_mode']} ({record['execution_mode_why']})")
    return RungResult(measurements=m, files_read=files, command=command, details=details, recipe_edits=edits)
