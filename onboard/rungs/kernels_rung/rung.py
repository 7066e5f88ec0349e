"""Rung 6, `kernels`: each fused kernel equals the plain PyTorch path it replaces (DESIGN sections 5 and 6),
and the recipe holds, per field, the value whole training steps earned.

For every kernel flag titan_core knows (`onboard.rungs.kernels_rung.compare.KERNEL_FLAGS`) the rung asks
whether it applies to this model on this device (`applicable_kernels`; one that does not is
recorded as not_applicable with the reason, never skipped). For each that applies it

1. compares the model with the kernel against the model with the field's plain path, same
   weights and batch, fp32 (`compare_kernel`): loss, logits and every parameter's gradient,
   relative L2 (titan_core.measure.numerics); the recipe's other kernel settings (ce_chunk, z_loss, ...)
   are on both sides;
2. checks it in the recipe's execution mode (`onboard.rungs.kernels_rung.modes.mode_check`): no graph
   break under per-block compile, no host sync and a clean capture under the Graph Trainer;
   a kernel that fails there is no candidate, with that reason.

kernels.float8 is a precision change, not a kernel of the same arithmetic: its recipes (tensorwise,
rowwise) are judged against the bf16 recipe by their own documented bound instead of steps 1-2
(`onboard.rungs.kernels_rung.float8_check`: each converted layer, and the recipe's loss over its steps).

The checklist judges the worst errors over all kernels (float8's by its own criteria). Then, per
field (loss, attention, moe, float8),
the keep rule (`kernels_decide`) sets each candidate against the value the recipe holds: whole
training steps of the recipe, optimizer included, in its own execution mode and precision
(`kernels_steps.WholeSteps`), timed interleaved through the one timing protocol (the
checklist's `params.timing`), and each side's fp32 step peak (`kernel_compare.step_peak`). Every
decision is a `decision.Decision` in `details["decisions"]`; each field's choice is in
`details["field_choices"]`; a field whose value changes becomes a `RecipeEdit`, which the engine
writes only when the gate passed.

Its gate is checklists/kernels.yaml; what it measures is KernelsMeasurements
(onboard/ladder/measurements/kernels_measurements.py), built once at the end of `run` from the
comparisons' part (`summarise`: `totals` and each flag's own numbers) and the setting's (`Bench.setting`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from onboard.ladder.gates import check_value
from onboard.rungs import gate_recipe, timing_profiles, train_run
from onboard.rungs.kernels_rung import float8_check as kernels_float8
from onboard.rungs.kernels_rung import steps as kernels_steps
from onboard.ladder.contract import SHIPPED, RungContext, RungResult
from onboard.rungs.kernels_rung.decide import MemoryRule, all_decisions, decide_all, field_inputs, mark_rows
from onboard.ladder.measurements.kernels_measurements import KernelsMeasurements
from titan_core.measure.timing import TimingProtocol
from onboard.rungs.kernels_rung.compare import PRECISION_FIELDS, REFERENCE, applicable_kernels, compare_kernel, parse_flag
from onboard.rungs.kernels_rung.compare import step_peak
from onboard.rungs.kernels_rung.modes import mode_check
from titan_core.config.execution_modes import execution_mode
from titan_core.models.common.swaps import SwapNotApplicable
from titan_core.kernels import KernelRefusesModel
from titan_core.runtime import devices
from titan_core.models.model_builder import build_model_from_config

RUNG = "kernels"
CAPTURE_UNSAFE = {"moe": "loop"}
"""Plain paths a captured step (torch.compile, Graph Trainer) cannot run: the expert loop reads the
routing on the host. Under capture they are no candidate; a recipe holding a kernel keeps it."""
ERROR_METRICS = {
    "loss_rel_err": "worst_loss_rel_err",
    "logits_rel_err": "worst_logits_rel_err",
    "max_grad_rel_err": "worst_grad_rel_err",
}
"""Per-kernel error -> the aggregate metric the checklist judges (its threshold is the per-kernel tolerance)."""


MEASUREMENTS = KernelsMeasurements


def protocol(profile: str = SHIPPED) -> TimingProtocol:
    """The timing protocol of the keep decisions: the checklist's `params.timing` under `profile`
    (the attempt's `ctx.timing_profile`)."""
    return timing_profiles.protocol(RUNG, profile)


def compare_shape(batch_size: int, seq_len: int, max_tokens: int | None = None) -> tuple[int, int, str]:
    """(batch, seq_len, why) of the fp32 comparison: the recipe's shape unless it is over max_tokens."""
    max_tokens = max_tokens or gate_recipe.param(RUNG, "compare_max_tokens")
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
    by_metric = {c.metric: c for c in gate_recipe.checklist(RUNG).criteria}
    return {name: by_metric[metric] for name, metric in ERROR_METRICS.items() if metric in by_metric}


def within_tolerance(errors: dict[str, float], criteria: dict[str, Any]) -> bool:
    """Whether one kernel's errors pass every error criterion of the checklist (the keep rule's "passes")."""
    return all(check_value(c, errors.get(name), c.threshold)[0] for name, c in criteria.items())


def _errors(cmp) -> dict[str, float]:
    return {"loss_rel_err": cmp.loss_rel_err, "logits_rel_err": cmp.logits_rel_err,
            "max_grad_rel_err": cmp.max_grad_rel_err}  # fmt: skip


def _finite(x: float) -> float:
    """NaN ranks as the worst error (it is one), not as an incomparable value."""
    return math.inf if math.isnan(x) else x


def _one_kernel(ctx, flag, *, build, criteria, mode_kw) -> dict:
    """Compare one applicable kernel with its plain path, then check it in the recipe's execution mode;
    a kernel that raises is a failed row. One that passes both is `eligible`: the keep rule times it."""
    row: dict[str, Any] = {"status": "compared", "eligible": False}
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
        row["reason"] = "it does not equal the plain path within the checklist's tolerance"
        return row  # a wrong kernel is never held: timing it would only cost time
    try:
        check = mode_check(flag=flag, **mode_kw)
    except Exception as e:  # noqa: BLE001 -- it cannot even be traced in the recipe's mode: no candidate, said why
        mode = mode_kw.get("mode")
        check = {"mode": mode, "ok": False, "reason": f"{flag} fails in {mode}: {type(e).__name__}: {e}"}
    row["mode_check"] = check
    if not check["ok"]:
        ctx.log(f"kernels: {check['reason']}")
        row["reason"] = f"it does not run in the recipe's execution mode: {check['reason']}"
        return row
    row["eligible"] = True
    return row


def summarise(rows: dict[str, dict]) -> KernelsMeasurements:
    """The record's comparisons part, from the per-flag rows: `totals`, and each flag's own (`per_flag`)."""
    return KernelsMeasurements.from_parts(totals(rows), per_kernel=per_flag(rows))


def _precision_change(flag: str) -> bool:
    return parse_flag(flag)[0] in PRECISION_FIELDS


def _worst(compared: dict[str, dict], error: str) -> tuple[float | None, str | None]:
    """(the worst of one per-kernel `error` over the compared rows, its flag); a row without it (it raised)
    is the worst (inf); (None, None) with nothing compared."""
    values = {f: (_finite(r[error]) if error in r else math.inf) for f, r in compared.items()}
    flag = max(values, key=values.get) if values else None
    return (values[flag] if flag else None), flag


def totals(rows: dict[str, dict]) -> KernelsMeasurements:
    """The record's totals part: counts, the worst errors and which kernel/param, over every kernel that
    applies (the fp32 errors over the kernels of the same arithmetic; float8's against its own bound,
    kernels_float8.totals)."""
    applies = {f: r for f, r in rows.items() if r["status"] != "not_applicable"}
    compared = {f: r for f, r in applies.items() if not _precision_change(f)}
    loss, loss_flag = _worst(compared, "loss_rel_err")
    logits, logits_flag = _worst(compared, "logits_rel_err")
    grad, grad_flag = _worst(compared, "max_grad_rel_err")
    # the worst of any kind: the first, in ERROR_METRICS' order, of the largest of the three
    worst = max(((v, f) for v, f in ((loss, loss_flag), (logits, logits_flag), (grad, grad_flag)) if f),
                key=lambda vf: vf[0], default=(None, None))[1]  # fmt: skip
    return KernelsMeasurements.from_parts(
        kernels_float8.totals(rows),
        kernels_considered=len(rows),
        kernels_applicable=len(applies),
        kernels_compared=sum(r["status"] == "compared" for r in applies.values()),
        kernels_raised=sum(r["status"] == "raised" for r in applies.values()),
        kernels_not_applicable=len(rows) - len(applies),
        worst_loss_rel_err=loss,
        worst_loss_kernel=loss_flag,
        worst_logits_rel_err=logits,
        worst_logits_kernel=logits_flag,
        worst_grad_rel_err=grad,
        worst_grad_kernel=grad_flag,
        worst_grad_param=compared[grad_flag].get("worst_param") if grad_flag else None,
        grads_excused_as_rounding=sum(len(r.get("excused_as_rounding", ())) for r in compared.values()),
        worst_kernel=worst,
    )


def per_flag(rows: dict[str, dict]) -> dict[str, Any]:
    """Each flag's numbers under its short name: loss_fused_ce_max_rel_err, attention_sdpa_kept, ...;
    `_kept`: the recipe holds that value after this rung."""
    m: dict[str, Any] = {}
    for flag, r in rows.items():
        short = flag.removeprefix("kernels.").replace("=", "_")
        if r["status"] == "not_applicable":
            m[f"{short}_not_applicable"] = r["reason"]
            continue
        if "loss_rel_err" in r:
            m[f"{short}_max_rel_err"] = max(_finite(r[n]) for n in ERROR_METRICS)
        if _precision_change(flag):
            m.update(kernels_float8.per_flag(short, r))
        if "time_ratio" in r:  # whole steps against the value the recipe held (`_timed_against`)
            m[f"{short}_time_ratio"] = r["time_ratio"]
            m[f"{short}_time_ratio_ci"] = r["time_ratio_ci"]
            m[f"{short}_timing"] = r["outcome"]
            m[f"{short}_timed_against"] = r["timed_against"]
            m[f"{short}_memory_saving"] = r["memory_saving"]
        m[f"{short}_kept"] = bool(r.get("kept"))  # the recipe holds it after this rung
    return m


@dataclass
class Bench:
    """Where and how the rung compares and times each kernel: the gate's recipe on this device, in
    the recipe's execution mode, fp32 comparison and peaks at `compare_shape`, whole steps at the
    recipe's batch."""

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
    peaks: dict = field(default_factory=dict)
    """{(field, value): (peak bytes or None, why not measured)}: each measured once per attempt."""

    @classmethod
    def of(cls, ctx: RungContext) -> "Bench":
        cfg = gate_recipe.job_config(ctx)
        device = devices.resolve_device(cfg.device.type, libtpu_init_flags=cfg.tpu.libtpu_init_flags)
        # a swap that would replace a port's own module (a custom attention core) does not apply
        builder = (lambda: build_model_from_config(cfg.model)[2]) if cfg.model.module_file else None
        return cls(ctx, cfg, execution_mode(gate_recipe.recipe(ctx)), device,
                   gate_recipe.resolved_device_type(cfg.device.type),
                   builder, compare_shape(cfg.training.batch_size, cfg.training.seq_len), protocol(ctx.timing_profile))  # fmt: skip

    @property
    def captured(self) -> bool:
        return self.mode != "eager"

    @property
    def dtype(self):
        return gate_recipe.compute_dtype(self.cfg.training)

    def applicable(self) -> dict[str, str | None]:
        """{flag: None if it applies, else why not} (kernel_compare.applicable_kernels)."""
        return applicable_kernels(gate_recipe.model_args(self.cfg), device=self.device_type, dtype=self.dtype,
                                  captured=self.captured, model=self.builder() if self.builder else None)  # fmt: skip

    def kwargs(self) -> tuple[dict, dict]:
        """(build, mode-check) keyword arguments of `_one_kernel`."""
        cfg, t = self.cfg, self.cfg.training
        cb, cs, _ = self.compare
        common = dict(family=cfg.model.family, args=gate_recipe.model_args(cfg), device=self.device, base=cfg.kernels,
                      build_meta_model=self.builder)  # fmt: skip
        grads = tolerances().get("max_grad_rel_err")
        rounding = dict(grad_tolerance=grads.threshold if grads else None,
                        rounding_factor=gate_recipe.param(RUNG, "grad_rounding_factor"))  # fmt: skip
        return (dict(common, batch=cb, seq_len=cs, **rounding),
                dict(common, mode=self.mode, batch=cb, seq_len=cs, packed=cfg.data.source == "text",
                     max_norm=t.max_norm))  # fmt: skip

    def peak(self, field_name: str, value: str) -> tuple[int | None, str | None]:
        """The keep rule's `Peak`: one fp32 forward + backward at the comparison's shape
        (kernel_compare.step_peak), the same way for every value of every field."""
        if (field_name, value) not in self.peaks:
            cb, cs, _ = self.compare
            self.peaks[field_name, value] = step_peak(
                self.cfg.model.family, gate_recipe.model_args(self.cfg), field_name, value, batch=cb, seq_len=cs,
                device=self.device, base=self.cfg.kernels, build_meta_model=self.builder,
            )  # fmt: skip
        return self.peaks[field_name, value]

    def plain_runs(self, field_name: str) -> str | None:
        """None when the field's plain path runs in the recipe's execution mode, else why not."""
        plain = REFERENCE[field_name]
        if not self.captured:
            return None
        if CAPTURE_UNSAFE.get(field_name) == plain:
            return f"a captured step cannot run {field_name}={plain}"
        flag = f"kernels.{field_name}={plain}"
        try:
            check = mode_check(flag=flag, **self.kwargs()[1])
        except Exception as e:  # noqa: BLE001 -- it cannot be traced in the recipe's mode: no candidate, said why
            return f"{flag} fails in {self.mode}: {type(e).__name__}: {e}"
        return None if check["ok"] else check["reason"]

    def setting(self) -> KernelsMeasurements:
        """The record's setting part: where the kernels were compared and timed."""
        t, (cb, cs, why) = self.cfg.training, self.compare
        return KernelsMeasurements(
            compare_dtype="float32", compare_batch_size=cb, compare_seq_len=cs, compare_shape_why=why,
            measure_batch_size=t.batch_size, measure_seq_len=t.seq_len, timing_protocol=self.proto.settings(),
            recipe_dtype=str(self.dtype).removeprefix("torch."), captured=self.captured, execution_mode=self.mode,
        )  # fmt: skip


def run(ctx: RungContext) -> RungResult:
    """Compare every applicable kernel, then decide each field against the value the recipe holds on
    whole steps; the fields that change come back as recipe edits."""
    bench = Bench.of(ctx)
    applicable = bench.applicable()
    announce(bench, applicable)
    with train_run.process_threads(bench.cfg.device.threads):
        rows = compare_all(bench, applicable)
        inputs = field_inputs(rows, bench.cfg.kernels, REFERENCE, ledger=ctx.workspace.ledger,
                              plain_runs=bench.plain_runs)  # fmt: skip
        with kernels_steps.WholeSteps(ctx, bench.proto) as steps:
            edits, choices = decide_all(inputs, time=steps.compare, peak=bench.peak, rule=MemoryRule.of_checklist())
    mark_rows(rows, choices)
    tell(ctx, choices)
    precision = gate_recipe.precision(bench.cfg.training)
    # the kernels were proved in fp32, one by one; the recipe they leave runs whole in its own precision
    _, whole = train_run.train_recipe(ctx, edits, steps=gate_recipe.param(RUNG, "recipe_steps"),
                                      label=f"kernels: the recipe with its kernels ({bench.mode}, {precision})")
    # the record, once: the comparisons' and the setting's parts, the edits proposed and the whole run
    m = KernelsMeasurements.from_parts(
        summarise(rows), bench.setting(),
        proposed_recipe_edits=[f"{e.key}={e.value}" for e in edits],  # written only if the gate passes
        precision=precision, whole_step_trainers=steps.built,
        recipe_steps_run=len(whole.metrics), recipe_loss_curve=[r["loss"] for r in whole.metrics],
    )  # fmt: skip
    for e in edits:
        ctx.log(f"kernels: recipe keeps {e.key} = {e.value!r} ({e.why}) if the gate passes")
    return RungResult(
        measurements=m,
        files_read=gate_recipe.files_read(ctx, bench.cfg),
        command=gate_recipe.next_step_command(ctx),
        details={
            "device": bench.device_type,
            "kernels": rows,
            "decisions": all_decisions(choices),
            "field_choices": {f: c.to_dict() for f, c in choices.items()},
            # each side's fp32 step peak, all measured alike (None: a JAX-backed side, not measured)
            "peaks": {f"{f}={v}": p for (f, v), (p, _) in bench.peaks.items()},
            "path": ctx.workspace.path_kind,
            "model_file": bench.cfg.model.module_file or None,
        },  # fmt: skip
        recipe_edits=edits,
    )


def tell(ctx: RungContext, choices: dict) -> None:
    """One line per decision, then what the recipe holds per field: "kept" only of a value it holds."""
    for f, c in choices.items():
        for d in c.decisions:
            ctx.log(f"kernels: {d.verdict}: {d.why}")
        if not c.edit:
            ctx.log(f"kernels: kernels.{f} = {c.value!r} kept: {c.why.removeprefix('kernels rung: ')}")


def announce(bench: Bench, applicable: dict[str, str | None]) -> None:
    t, (cb, cs, _), proto = bench.cfg.training, bench.compare, bench.proto
    n_apply = sum(reason is None for reason in applicable.values())
    bench.ctx.log(
        f"kernels: {n_apply} of {len(applicable)} kernel flags apply on {bench.device_type}, judged in the recipe's "
        f"execution mode ({bench.mode}); fp32 comparison at {cb} x {cs} tokens, whole training steps of the "
        f"recipe at {t.batch_size} x {t.seq_len} against the value it holds (interleaved, {proto.min_rounds}-"
        f"{proto.max_rounds} rounds, {proto.confidence:.0%} interval); timing: {proto.describe_budget()}"
    )


def compare_all(bench: Bench, applicable: dict[str, str | None]) -> dict[str, dict]:
    """{flag: row}: each kernel that applies compared and checked (`_one_kernel`), the others with why not."""
    build, mode_kw = bench.kwargs()
    float8 = kernels_float8.Float8Check(bench.ctx, bench.cfg, device=bench.device, builder=bench.builder,
                                        mode_kw=mode_kw)  # fmt: skip
    rows: dict[str, dict] = {}
    for flag, reason in applicable.items():
        if reason is not None:
            rows[flag] = {"status": "not_applicable", "reason": reason}
            bench.ctx.log(f"kernels: {flag} not applicable: {reason}")
            continue
        if _precision_change(flag):  # judged against the bf16 recipe by its own bound
            rows[flag] = float8.row(flag)
            continue
        rows[flag] = _one_kernel(bench.ctx, flag, build=build, criteria=tolerances(), mode_kw=mode_kw)
    return rows
