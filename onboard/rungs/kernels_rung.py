"""Rung 6, `kernels`: each fused kernel equals the plain PyTorch path it replaces (DESIGN sections 5 and 6).

For every kernel flag titan_core knows (`onboard.rungs.kernel_compare.KERNEL_FLAGS`) the rung asks
whether it applies to this model on this device (`applicable_kernels`; one that does not is
recorded as not_applicable with the reason, never skipped). For each that applies it

1. compares the model with the kernel against the model with the field's plain path, same
   weights and batch, fp32 (`compare_kernel`): loss, logits and every parameter's gradient,
   relative L2 (titan_core.measure.numerics); the recipe's other kernel settings (ce_chunk, z_loss, ...)
   are on both sides;
2. checks it in the recipe's execution mode (`onboard.rungs.kernel_modes.mode_check`): no graph
   break under per-block compile, no host sync and a clean capture under the Graph Trainer;
   a kernel that fails there is not kept, with that reason;
3. times one training step (forward + backward) with and without it at the recipe's batch
   through the one timing protocol (`measure_kernel`, titan_core.measure.timing, settings in the
   checklist's `params.timing`): interleaved, with an interval, `faster` / `slower` /
   `indistinguishable`; and measures each side's peak memory.

The checklist judges the worst errors over all kernels. The keep rule then picks, per field
(loss, attention, moe), what the recipe should run; a field whose pick differs from the recipe
becomes a `RecipeEdit`, which the engine writes only when the gate passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from onboard.engine.gates import check_value
from onboard.rungs import harness
from onboard.rungs.contract import RecipeEdit, RungContext, RungResult
from onboard.rungs.kernels_measurements import KernelsMeasurements
from onboard.rungs.execution_mode import recipe_mode
from titan_core.measure.timing import TimingProtocol
from titan_core.memory.estimate import format_bytes

RUNG = "kernels"
reads_recipe_key = harness.reads_all_but_tuning
CAPTURE_UNSAFE = {"moe": "loop"}
"""Plain paths a captured step (torch.compile, Graph Trainer) cannot run: the expert loop reads the
routing on the host. Under capture the keep rule never falls back to them; the recipe keeps its value."""
ERROR_METRICS = {
    "loss_rel_err": "worst_loss_rel_err",
    "logits_rel_err": "worst_logits_rel_err",
    "max_grad_rel_err": "worst_grad_rel_err",
}
"""Per-kernel error -> the aggregate metric the checklist judges (its threshold is the per-kernel tolerance)."""


MEASUREMENTS = KernelsMeasurements


def protocol():
    """The timing protocol of the keep decisions, from the checklist's `params.timing`."""
    return TimingProtocol.from_dict(harness.param(RUNG, "timing"))


def compare_shape(batch_size: int, seq_len: int, max_tokens: int | None = None) -> tuple[int, int, str]:
    """(batch, seq_len, why) of the fp32 comparison: the recipe's shape unless it is over max_tokens."""
    max_tokens = max_tokens or harness.param(RUNG, "compare_max_tokens")
    if batch_size * seq_len <= max_tokens:
        return batch_size, seq_len, "the recipe's batch_size x seq_len"
    batch = max(1, max_tokens // seq_len)
    seq = min(seq_len, max_tokens // batch)
    return (
        batch,
        seq,
        (
            f"the recipe's {batch_size} x {seq_len} tokens capped at {max_tokens} (params.compare_max_tokens) to keep "
            "the two fp32 models and their gradients small"
        ),
    )


def tolerances() -> dict[str, Any]:
    """{per-kernel error name: the checklist criterion that judges it}: thresholds live in the YAML only."""
    by_metric = {c.metric: c for c in harness.checklist(RUNG).criteria}
    return {name: by_metric[metric] for name, metric in ERROR_METRICS.items() if metric in by_metric}


def within_tolerance(errors: dict[str, float], criteria: dict[str, Any]) -> bool:
    """Whether one kernel's errors pass every error criterion of the checklist (the keep rule's "passes")."""
    return all(check_value(c, errors.get(name), c.threshold)[0] for name, c in criteria.items())


def keep_decision(*, passed: bool, timing: dict, peak_with: int | None, peak_without: int | None,
                  speed: str = "") -> dict[str, Any]:  # fmt: skip
    """Whether the recipe keeps a kernel: it passes, and it is `faster` than the plain path by the
    timing protocol, or it saves at least `params.min_memory_saving_percent` of the step's peak memory.

    `indistinguishable` keeps the plain path, the simpler choice. The saving is judged in
    whole bytes (100 x (without - with) >= pct x without) so the edge is exact; an unknown
    peak (None) cannot claim a saving. `speed`: the protocol's one-line description.
    """
    pct = harness.param(RUNG, "min_memory_saving_percent")
    faster = timing["outcome"] == "faster"
    known = peak_with is not None and peak_without is not None and peak_without > 0
    saving = 1 - peak_with / peak_without if known else None
    saves = known and 100 * (peak_without - peak_with) >= pct * peak_without
    kept = passed and (faster or saves)
    speed = (
        speed
        or f"{timing['outcome']} (time ratio {timing['ratio']:.2f}, CI {timing['ci_low']:.2f}-{timing['ci_high']:.2f})"
    )
    if saving is not None:
        memory = f"{saving:.0%} less peak memory" if saving >= 0 else f"{-saving:.0%} more peak memory"
    else:
        memory = "no peak memory without it to save from" if peak_without == 0 else "peak memory not measured"
    if not passed:
        reason = "it does not equal the plain path within the checklist's tolerance"
    elif faster:
        reason = f"faster ({speed}; {memory})"
    elif saves:
        reason = f"saves >= {pct}% peak memory ({memory}; {speed})"
    else:
        reason = f"not faster ({speed}) and saves < {pct}% peak memory ({memory}): the plain path is simpler"
    return {
        "kept": kept,
        "outcome": timing["outcome"],
        "memory_saving": saving,
        "time_ratio": timing["ratio"],
        "time_ratio_ci": [timing["ci_low"], timing["ci_high"]],
        "reason": reason,
        "why": f"{'kept' if kept else 'not kept'}: {reason}",
    }


Contest = Callable[[str, str], dict]
"""(challenger, holder) -> measure_kernel's answer for the challenger against the holder."""


def choose(field_name: str, rows: dict[str, dict], current: str, *, reference: str,
           captured: bool = False, contest: Contest | None = None) -> tuple[str, str, list[dict]]:  # fmt: skip
    """(value, why, contests) for one kernels field; `current` is the recipe's value.

    `rows`: {choice: {"kept": bool, "ran": bool, "outcome": str | None, "max_rel_err": float,
    "reason": str}} of the field's compared kernels, in KERNEL_FLAGS order (simplest first);
    `ran`: it matched and runs in the recipe's execution mode. The recipe's value is the
    incumbent: only measured evidence moves the field, so a re-run on noise never flips it.

    - Kernels kept: the incumbent holds if it is one of them, else the simplest kept kernel;
      a later kept one takes the field only by being `faster` head to head (`contest`).
    - None kept: the incumbent stays if it is the plain path, or the library's default
      (attention = sdpa) that ran and was not `slower` than the plain path; else the plain
      path, except that under capture a plain path the step cannot run (CAPTURE_UNSAFE) is
      never chosen.
    """
    from titan_core.kernels import DEFAULTS  # lazy: loads torch; onboard status imports the rungs

    kept = [choice for choice, r in rows.items() if r["kept"]]
    contests: list[dict] = []
    if kept:
        order = ([current] if current in kept else []) + [c for c in kept if c != current]
        best = order[0]
        for challenger in order[1:]:
            if contest is None:
                break
            result = contest(challenger, best)
            won = result["timing"]["outcome"] == "faster"
            contests.append({"challenger": challenger, "holder": best, "won": won, "timing": result["timing"],
                             "describe": result.get("describe", "")})  # fmt: skip
            best = challenger if won else best
        r = rows[best]
        others = f"; held against {len(kept) - 1} other kept kernel(s) head to head" if len(kept) > 1 else ""
        return best, (f"kernels rung: matches {field_name}={reference} (fp32 rel err {r['max_rel_err']:.1e}); "
                      f"{r['reason']}{others}"), contests  # fmt: skip
    r = rows.get(current) or {}
    if current != reference and current == DEFAULTS.get(field_name) and r.get("ran") and r.get("outcome") != "slower":
        return current, (f"kernels rung: no {field_name} kernel was faster; the recipe's {current}, the library "
                         f"default, matched and is not slower than {reference}: it stays"), []  # fmt: skip
    if captured and CAPTURE_UNSAFE.get(field_name) == reference and current != reference:
        return current, f"kernels rung: no {field_name} kernel kept, but a captured step cannot run {reference}", []
    pct = harness.param(RUNG, "min_memory_saving_percent")
    return reference, (f"kernels rung: no {field_name} kernel both matched and was faster or saved "
                       f">= {pct}% peak memory; the plain path"), []  # fmt: skip


def _errors(cmp) -> dict[str, float]:
    return {"loss_rel_err": cmp.loss_rel_err, "logits_rel_err": cmp.logits_rel_err,
            "max_grad_rel_err": cmp.max_grad_rel_err}  # fmt: skip


def _finite(x: float) -> float:
    """NaN ranks as the worst error (it is one), not as an incomparable value."""
    return math.inf if math.isnan(x) else x


def _one_kernel(ctx, flag, *, build, timing_kw, criteria, mode_kw) -> dict:
    """Compare one applicable kernel with its plain path, check it in the recipe's execution mode,
    then time it; a kernel that raises is a failed row."""
    # lazy: loads torch; onboard status imports the rungs
    from onboard.rungs.kernel_compare import compare_kernel, measure_kernel
    from onboard.rungs.kernel_modes import mode_check  # lazy: loads torch; onboard status imports the rungs
    from titan_core.config.swaps import SwapNotApplicable  # lazy: loads torch; onboard status imports the rungs
    from titan_core.kernels import KernelRefusesModel  # lazy: loads torch; onboard status imports the rungs

    row: dict[str, Any] = {"status": "compared"}
    try:
        cmp = compare_kernel(flag=flag, **build)
    except (KernelRefusesModel, SwapNotApplicable) as e:
        # the kernel cannot compute this model (gemma2's soft-capped scores under sdpa): it does not
        # apply, with the reason, as applicable_kernels would have said had it known beforehand
        ctx.log(f"kernels: {flag} not applicable: {e}")
        return {"status": "not_applicable", "reason": " ".join(str(e).split())}
    except Exception as e:  # noqa: BLE001 -- recorded as this kernel's failure, which fails the gate
        ctx.log(f"kernels: {flag} raised {type(e).__name__}: {e}")
        return {"status": "raised", "error": f"{type(e).__name__}: {e}", "kept": False}
    errors = _errors(cmp)
    worst5 = sorted(cmp.grad_rel_err.items(), key=lambda kv: -_finite(kv[1]))[:5]
    row.update(reference=cmp.reference, loss=cmp.loss, loss_reference=cmp.loss_reference, **errors,
               worst_param=cmp.worst_param, worst_params=dict(worst5),
               passed=within_tolerance(errors, criteria))  # fmt: skip
    if cmp.rounding or cmp.rounding_error:
        row.update(max_grad_rel_err_raw=cmp.max_grad_rel_err_raw, fp64_check=cmp.rounding,
                   excused_as_rounding=cmp.excused, fp64_check_error=cmp.rounding_error)  # fmt: skip
    excused = f"; {len(cmp.excused)} over it excused as fp32 rounding (fp64 check)" if cmp.excused else ""
    ctx.log(
        f"kernels: {flag} vs {cmp.reference}: loss {cmp.loss_rel_err:.1e}, logits {cmp.logits_rel_err:.1e}, "
        f"grads {cmp.max_grad_rel_err:.1e} ({cmp.worst_param}){excused}" + ("" if row["passed"] else " -- FAILS")
    )
    if not row["passed"]:
        row.update(kept=False, reason="it does not equal the plain path within the checklist's tolerance")
        row["why"] = f"not kept: {row['reason']}"
        return row  # a wrong kernel is never kept: timing it would only cost time
    try:
        check = mode_check(flag=flag, **mode_kw)
    except Exception as e:  # noqa: BLE001 -- it cannot even be traced in the recipe's mode: not kept, said why
        check = {
            "mode": mode_kw["mode"],
            "ok": False,
            "reason": f"{flag} fails in {mode_kw['mode']}: {type(e).__name__}: {e}",
        }
    row["mode_check"] = check
    if not check["ok"]:
        ctx.log(f"kernels: {check['reason']}")
        row.update(kept=False, reason=f"it does not run in the recipe's execution mode: {check['reason']}")
        row["why"] = f"not kept: {row['reason']}"
        return row
    try:
        timing = measure_kernel(flag=flag, **timing_kw)
    except Exception as e:  # noqa: BLE001 -- it cannot run the recipe's step: a failure, not a warning
        ctx.log(f"kernels: {flag} raised {type(e).__name__} in the timed step: {e}")
        return {**row, "status": "raised", "error": f"timed step: {type(e).__name__}: {e}", "kept": False}
    w, wo = timing["with_kernel"], timing["with_reference"]
    decision = keep_decision(passed=True, timing=timing["timing"], peak_with=w["peak_memory_bytes"],
                             peak_without=wo["peak_memory_bytes"], speed=timing.get("describe", ""))  # fmt: skip
    row.update(step_time_s=w["step_time_s"], reference_step_time_s=wo["step_time_s"], timing=timing["timing"],
               peak_memory_bytes=w["peak_memory_bytes"], reference_peak_memory_bytes=wo["peak_memory_bytes"],
               **decision)  # fmt: skip
    peaks = f"{format_bytes(w['peak_memory_bytes'])} vs {format_bytes(wo['peak_memory_bytes'])}"
    ctx.log(f"kernels: {flag}: peak {peaks}: {decision['why']}")
    return row


def summarise(rows: dict[str, dict]) -> dict[str, Any]:
    """Flat gate measurements from the per-flag rows: `totals`, then each flag's own (`per_flag`)."""
    return {**totals(rows), **per_flag(rows)}


def totals(rows: dict[str, dict]) -> dict[str, Any]:
    """Counts, the worst errors and which kernel/param, over every kernel that applies."""
    compared = {f: r for f, r in rows.items() if r["status"] != "not_applicable"}
    m: dict[str, Any] = {
        "kernels_considered": len(rows),
        "kernels_applicable": len(compared),
        "kernels_compared": sum(r["status"] == "compared" for r in compared.values()),
        "kernels_raised": sum(r["status"] == "raised" for r in compared.values()),
        "kernels_not_applicable": len(rows) - len(compared),
    }
    worst_overall, worst_flag = -1.0, None
    for name, metric in ERROR_METRICS.items():
        values = {f: (_finite(r[name]) if name in r else math.inf) for f, r in compared.items()}
        flag = max(values, key=values.get) if values else None
        m[metric] = values[flag] if flag else None
        m[metric.replace("_rel_err", "_kernel")] = flag
        if flag and values[flag] > worst_overall:
            worst_overall, worst_flag = values[flag], flag
    m["worst_kernel"] = worst_flag
    grad_flag = m["worst_grad_kernel"]
    m["worst_grad_param"] = compared[grad_flag].get("worst_param") if grad_flag else None
    m["grads_excused_as_rounding"] = sum(len(r.get("excused_as_rounding", ())) for r in compared.values())
    return m


def per_flag(rows: dict[str, dict]) -> dict[str, Any]:
    """Each flag's numbers under its short name: loss_fused_ce_max_rel_err, attention_sdpa_kept, ..."""
    m: dict[str, Any] = {}
    for flag, r in rows.items():
        short = flag.removeprefix("kernels.").replace("=", "_")
        if r["status"] == "not_applicable":
            m[f"{short}_not_applicable"] = r["reason"]
            continue
        if "loss_rel_err" in r:
            m[f"{short}_max_rel_err"] = max(_finite(r[n]) for n in ERROR_METRICS)
        if "time_ratio" in r:
            m[f"{short}_time_ratio"] = r["time_ratio"]
            m[f"{short}_time_ratio_ci"] = r["time_ratio_ci"]
            m[f"{short}_timing"] = r["outcome"]
            m[f"{short}_memory_saving"] = r["memory_saving"]
        m[f"{short}_kept"] = bool(r.get("kept"))
    return m


def decide(rows: dict[str, dict], current, *, captured: bool,
           contest: Contest | None = None) -> tuple[list[RecipeEdit], dict[str, dict]]:  # fmt: skip
    """(recipe edits, decision per field) from the per-flag rows; `current` is the recipe's Kernels section.

    `contest(field, challenger, holder)` times two kept kernels of one field head to head."""
    # lazy: loads torch; onboard status imports the rungs
    from onboard.rungs.kernel_compare import REFERENCE, parse_flag

    by_field: dict[str, dict[str, dict]] = {}
    for flag, r in rows.items():
        if r["status"] != "not_applicable":
            field_name, choice = parse_flag(flag)
            by_field.setdefault(field_name, {})[choice] = {
                "kept": bool(r.get("kept")), "ran": "timing" in r, "outcome": r.get("outcome"),
                "max_rel_err": max(_finite(r.get(n, math.inf)) for n in ERROR_METRICS), "reason": r.get("reason", ""),
            }  # fmt: skip
    edits, decisions = [], {}
    for field_name, reference in REFERENCE.items():
        now = getattr(current, field_name)
        if field_name not in by_field:
            decisions[field_name] = {"value": now, "edit": False, "why": "no kernel of this field applies here"}
            continue
        field_contest = (lambda a, b, f=field_name: contest(f, a, b)) if contest else None
        value, why, contests = choose(field_name, by_field[field_name], now, reference=reference,
                                      captured=captured, contest=field_contest)  # fmt: skip
        decisions[field_name] = {"value": value, "was": now, "edit": value != now, "why": why, "contests": contests}
        if value != now:
            edits.append(RecipeEdit(f"kernels.{field_name}", value, why))
    return edits, decisions


@dataclass
class Bench:
    """Where and how the rung compares and times each kernel: the gate's recipe on this device, in
    the recipe's execution mode, fp32 comparison at `compare_shape`, timing at the recipe's batch."""

    ctx: RungContext
    cfg: Any
    """The gate's JobConfig."""
    mode: str
    """The recipe's execution mode: eager, compile or graph_trainer."""
    device: Any
    """The torch device (titan_core.runtime.devices.resolve_device)."""
    device_type: str
    builder: Callable | None
    """Builds a port's own model.py (the swaps then replace its modules); None: the family's class."""
    compare: tuple[int, int, str]
    """(batch, seq_len, why) of the fp32 comparison."""
    proto: Any
    """The timing protocol (params.timing)."""

    @classmethod
    def of(cls, ctx: RungContext) -> "Bench":
        from titan_core.runtime import devices  # lazy: loads torch; onboard status imports the rungs

        # lazy: loads torch; onboard status imports the rungs
        from titan_core.training.model_builder import build_model_from_config

        cfg = harness.job_config(ctx)
        device = devices.resolve_device(cfg.device.type, libtpu_init_flags=cfg.tpu.libtpu_init_flags)
        # a swap that would replace a port's own module (a custom attention core) does not apply
        builder = (lambda: build_model_from_config(cfg.model)[2]) if cfg.model.module_file else None
        return cls(ctx, cfg, recipe_mode(harness.recipe(ctx)), device, harness.resolved_device_type(cfg.device.type),
                   builder, compare_shape(cfg.training.batch_size, cfg.training.seq_len), protocol())  # fmt: skip

    @property
    def captured(self) -> bool:
        return self.mode != "eager"

    @property
    def dtype(self):
        return harness.compute_dtype(self.cfg.training)

    def applicable(self) -> dict[str, str | None]:
        """{flag: None if it applies, else why not} (kernel_compare.applicable_kernels)."""
        # lazy: loads torch; onboard status imports the rungs
        from onboard.rungs.kernel_compare import applicable_kernels

        return applicable_kernels(harness.model_args(self.cfg), device=self.device_type, dtype=self.dtype,
                                  captured=self.captured, model=self.builder() if self.builder else None)  # fmt: skip

    def kwargs(self) -> tuple[dict, dict, dict]:
        """(build, timing, mode-check) keyword arguments of `_one_kernel`."""
        cfg, t = self.cfg, self.cfg.training
        cb, cs, _ = self.compare
        common = dict(family=cfg.model.family, args=harness.model_args(cfg), device=self.device, base=cfg.kernels,
                      build_meta_model=self.builder)  # fmt: skip
        grads = tolerances().get("max_grad_rel_err")
        rounding = dict(grad_tolerance=grads.threshold if grads else None,
                        rounding_factor=harness.param(RUNG, "grad_rounding_factor"))  # fmt: skip
        return (dict(common, batch=cb, seq_len=cs, **rounding),
                dict(common, batch=t.batch_size, seq_len=t.seq_len, protocol=self.proto),
                dict(common, mode=self.mode, batch=cb, seq_len=cs, packed=cfg.data.source == "text",
                     max_norm=t.max_norm))  # fmt: skip

    def contest(self, field_name: str, challenger: str, holder: str) -> dict:
        """`decide`'s head-to-head timing of two kept kernels of one field."""
        from onboard.rungs.kernel_compare import measure_kernel  # lazy: loads torch; onboard status imports the rungs

        out = measure_kernel(flag=f"kernels.{field_name}={challenger}", against=holder, **self.kwargs()[1])
        self.ctx.log(f"kernels: head to head: {out['describe']}")
        return out

    def setting(self) -> dict[str, Any]:
        """The measurements that say where the kernels were compared and timed."""
        t, (cb, cs, why) = self.cfg.training, self.compare
        return dict(compare_dtype="float32", compare_batch_size=cb, compare_seq_len=cs, compare_shape_why=why,
                    measure_batch_size=t.batch_size, measure_seq_len=t.seq_len, timing_protocol=vars(self.proto),
                    recipe_dtype=str(self.dtype).removeprefix("torch."), captured=self.captured,
                    execution_mode=self.mode)  # fmt: skip


def run(ctx: RungContext) -> RungResult:
    """Compare and time every applicable kernel; the keep rule's picks come back as recipe edits."""
    bench = Bench.of(ctx)
    applicable = bench.applicable()
    announce(bench, applicable)
    with harness.process_threads(bench.cfg.device.threads):
        rows = compare_all(bench, applicable)
        edits, decisions = decide(rows, bench.cfg.kernels, captured=bench.captured, contest=bench.contest)
    proposed = [f"{e.key}={e.value}" for e in edits]  # written only if the gate passes
    m = KernelsMeasurements(
        **totals(rows), per_kernel=per_flag(rows), **bench.setting(), proposed_recipe_edits=proposed,
        precision=harness.precision(bench.cfg.training),
    )
    # the kernels were proved in fp32, one by one; the recipe they leave runs whole in its own precision
    _, whole = harness.train_recipe(ctx, edits, steps=harness.param(RUNG, "recipe_steps"),
                                    label=f"kernels: the recipe with its kernels ({bench.mode}, {m.precision})")
    m.update(recipe_steps_run=len(whole.metrics), recipe_loss_curve=[r["loss"] for r in whole.metrics])
    for e in edits:
        ctx.log(f"kernels: recipe keeps {e.key} = {e.value!r} ({e.why}) if the gate passes")
    return RungResult(
        measurements=m,
        files_read=harness.files_read(ctx, bench.cfg),
        command=harness.next_step_command(ctx),
        details={
            "device": bench.device_type,
            "kernels": rows,
            "decisions": decisions,
            "path": ctx.workspace.path_kind,
            "model_file": bench.cfg.model.module_file or None,
        },  # fmt: skip
        recipe_edits=edits,
    )


def announce(bench: Bench, applicable: dict[str, str | None]) -> None:
    t, (cb, cs, _), proto = bench.cfg.training, bench.compare, bench.proto
    n_apply = sum(reason is None for reason in applicable.values())
    bench.ctx.log(
        f"kernels: {n_apply} of {len(applicable)} kernel flags apply on {bench.device_type}, judged in the recipe's "
        f"execution mode ({bench.mode}); fp32 comparison at "
        f"{cb} x {cs} tokens, timing at {t.batch_size} x {t.seq_len} (interleaved, {proto.min_rounds}-"
        f"{proto.max_rounds} rounds, {proto.confidence:.0%} interval)"
    )


def compare_all(bench: Bench, applicable: dict[str, str | None]) -> dict[str, dict]:
    """{flag: row}: each kernel that applies compared, checked and timed (`_one_kernel`), the others with why not."""
    build, timing_kw, mode_kw = bench.kwargs()
    rows: dict[str, dict] = {}
    for flag, reason in applicable.items():
        if reason is not None:
            rows[flag] = {"status": "not_applicable", "reason": reason}
            bench.ctx.log(f"kernels: {flag} not applicable: {reason}")
            continue
        rows[flag] = _one_kernel(bench.ctx, flag, build=build, timing_kw=timing_kw, criteria=tolerances(),
                                 mode_kw=mode_kw)  # fmt: skip
    return rows
