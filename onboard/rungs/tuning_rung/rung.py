"""Rung 7, `tuning`: block sizes, the batch and compiler/runtime flags tuned on the device at hand,
each change classified, then a profile of the result (DESIGN sections 1 and 5).

The rung tunes the recipe as it trains (its execution mode and kernels), on the recipe's data in
order (never the eager gate's repeated batch, so two ways of splitting the same rows into
micro-batches see the same tokens), in the optimisation handbook's order: the block sizes of the
kernels the recipe kept (`ce_chunk` of fused_ce; attention and MoE expose none), the batch
(tuning/search.py), activation checkpointing where memory ended the batch search (the batch it buys:
tuning/recompute.py), the flags of this device kind (tuning/flags.py).

Every change is classified on step 1 against the recipe it would change (tuning/classify.py;
diverged is rejected untimed), then timed against it per token by the one timing protocol and
kept only by the keep rule (tuning/decisions.py), each recording its Decision. Then the final
recipe (every kept change together) is classified against the untuned recipe on the same rows,
run once as a whole through `Trainer.train`, and profiled (tuning/profile.py). The kept values
come back as recipe edits, written by the engine only when the gate passed.

Its gate is checklists/tuning.yaml; what it measures is TuningMeasurements
(onboard/ladder/measurements/training_measurements.py), built once at the end of `run` from the
changes' and the final recipe's part (`summarise`), the final run's speed and the rest by keyword.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from onboard.rungs import gate_recipe, run_compare, timing_profiles, train_run
from onboard.rungs.tuning_rung import flags as flag_table
from onboard.ladder.contract import SHIPPED, RecipeEdit, RungContext, RungResult
from onboard.rungs.tuning_rung.batch import BatchTrials, max_doublings
from onboard.rungs.tuning_rung.recompute import kept_not_exact, try_checkpointing
from onboard.rungs.tuning_rung.decisions import change_decision, keep_rule
from onboard.ladder.measurements.training_measurements import SteadyRun, TuningMeasurements
from onboard.ladder.table import TUNING_KEYS
from onboard.rungs.tuning_rung.runs import Runs
from titan_core.config.loader import get_key, load_toml, with_keys
from titan_core.config.execution_modes import execution_mode, set_execution_mode
from titan_core.measure.run_stats import not_whole
from titan_core.measure.timing import TimingProtocol
from titan_core.memory.estimate import format_bytes
from titan_core.launcher import cpu_count
from onboard.rungs.tuning_rung.search import search
from onboard.rungs.tuning_rung.classify import classify, curve_check
from onboard.rungs.tuning_rung.profile import profile_steps
from titan_core.memory.budget import device_budget
import torch

RUNG = "tuning"
TUNED_KEYS = tuple(sorted(TUNING_KEYS))
"""The recipe keys this rung may edit (each kept change sets some of them)."""
UNTUNED = "untuned"
MEASUREMENTS = TuningMeasurements


def param(name: str, precision: str | None = None) -> Any:
    return gate_recipe.param(RUNG, name, precision)


def rounding_rel(ctx: RungContext, cfg) -> float:
    """Where rounding ends for a change of this recipe: the bound its final recipe is judged by
    (criterion final_step1_loss) in the recipe's precision, so no change is kept that the gate would
    then fail, and a bf16 recipe is not held to fp32's rounding."""
    return gate_recipe.bound(RUNG, "final_step1_loss", gate_recipe.precision(cfg.training), ctx.evidence)


def protocol(profile: str = SHIPPED) -> TimingProtocol:
    """The timing protocol of every keep decision, under `profile` (the attempt's `ctx.timing_profile`)."""
    return timing_profiles.protocol(RUNG, profile)


def tuning_config(ctx: RungContext):
    """The recipe as it trains, for the gate: its own execution mode, its data in order, output here."""
    cfg = gate_recipe.job_config(ctx)
    set_execution_mode(cfg, execution_mode(gate_recipe.recipe(ctx)))
    cfg.data.repeat_batch = False
    return cfg


def global_batch_fixed(ctx: RungContext) -> bool:
    """Whether the recipe fixes its global batch: it sets training.grad_accum itself (any value)."""
    return "grad_accum" in (load_toml(ctx.workspace.recipe_path).get("training") or {})


def memory_budget(device) -> tuple[int | None, str]:
    """(bytes one process may use on `device`, where that comes from); tests replace this to make it bind."""
    budget = device_budget(device)
    return (budget.bytes, budget.source) if budget else (None, f"no memory budget is known for {device.type}")


class Tuner:
    """The recipe holding each field as the steps go (`holder`), and every change tried (`changes`)."""

    def __init__(self, ctx: RungContext, base, runs: Runs, device_kind: str, proto: TimingProtocol | None = None):
        self.ctx, self.runs, self.kind = ctx, runs, device_kind
        self.proto = proto or protocol(ctx.timing_profile)
        """The rung's one protocol: its budget_s bounds every comparison of the attempt together."""
        self.base = base
        self.holder, self.cfg = UNTUNED, base
        self.changes: list[dict] = []
        self.notes: list[dict] = []
        """What was not tried, and why (not applicable here, needs a fresh process, ...)."""
        self.decisions: list[dict] = []
        """Each change's Decision (to_dict), in the order tried: the rung's details.decisions."""
        runs.probe(UNTUNED, base)

    def matched(self, label: str, cfg, rows: int) -> str:
        """The label of `cfg` accumulated to `rows` rows per step (same per-device batch), probed."""
        t = cfg.training
        if t.batch_size * t.grad_accum == rows:
            return label
        if rows % t.batch_size:
            raise ValueError(f"{rows} rows per step is not a multiple of {label}'s batch {t.batch_size}")
        same = f"{label}@{rows}rows"
        self.runs.probe(same, with_keys(cfg, {"training.grad_accum": rows // t.batch_size}))
        return same

    def classify(self, label: str, cfg, against: str, against_cfg):
        ref = self.matched(against, against_cfg, cfg.training.batch_size * cfg.training.grad_accum)
        return classify(self.runs.step1[label], self.runs.step1[ref], rounding_rel=rounding_rel(self.ctx, cfg)), ref

    def curve_check(self, label: str, cfg, ref: str, ref_cfg):
        steps = param("curve_steps")
        return curve_check(self.runs.curve(label, cfg, steps), self.runs.curve(ref, ref_cfg, steps),
                           tolerance=param("curve_rel", gate_recipe.precision(cfg.training)))  # fmt: skip

    def record(self, step: str, label: str, values: dict, cls, ref: str, cmp, curve, kept: bool, why: str,
               timed_against: str | None = None) -> dict:  # fmt: skip
        against = timed_against or self.holder
        if step != "batch":  # the batch search's Decisions are its chain's (BatchTrials.decisions)
            d = change_decision(self.ctx.workspace.ledger, step=step, label=label, values=values,
                                holder_cfg=self.runs.cfgs.get(against, self.cfg), holder_label=against, cls=cls,
                                cmp=cmp, kept=kept, why=why)  # fmt: skip
            self.decisions.append(d.to_dict())
        row = {
            "step": step, "change": label, "values": values, "against": against, "classified_against": ref,
            "class": cls.cls, "classification": cls.to_dict(), "peak_mem_bytes": self.runs.peak.get(label),
            "timing": cmp.to_dict() if cmp else None,
            "describe": cmp.describe(label, against) + " (per token)" if cmp else "",
            "tokens_per_s": 1 / cmp.candidate_median_s if cmp else None,
            "curve": curve.to_dict() if curve else None, "kept": kept, "why": why,
        }  # fmt: skip
        self.changes.append(row)
        self.ctx.log(f"tuning: {step}: {label}: {cls.cls}; {row['describe'] or 'not timed'}: "
                     f"{'kept' if kept else 'not kept'} ({why})")  # fmt: skip
        return row

    def trial(self, step: str, label: str, values: dict) -> dict:
        """One change of the holder: classify it, time it, check its curve if rounding; kept -> it holds."""
        cfg = with_keys(self.cfg, values)
        self.runs.probe(label, cfg)
        cls, ref = self.classify(label, cfg, self.holder, self.cfg)
        cmp = None if cls.rejected else self.runs.compare(label, self.holder, self.proto)
        curve = None
        if cmp is not None and cmp.outcome == "faster" and cls.cls == "rounding":
            curve = self.curve_check(label, cfg, ref, self.cfg)
        kept, why = keep_rule(cls, cmp, curve)
        row = self.record(step, label, values, cls, ref, cmp, curve, kept, why)
        if kept:
            self.holder, self.cfg = label, cfg
        self.runs.keep_only(self.holder)
        return row

    def note(self, step: str, what: str, why: str, **extra) -> None:
        self.notes.append({"step": step, "what": what, "why": why, **extra})
        self.ctx.log(f"tuning: {step}: {what}: not tried: {why}")

    # ---- 1. block sizes ---------------------------------------------------------------------
    def block_sizes(self, args) -> None:
        k, t = self.cfg.kernels, self.cfg.training
        if k.loss == "fused_ce":
            tokens = t.batch_size * t.seq_len
            for chunk in param("block_sizes")["ce_chunk"][self.kind]:
                now = self.cfg.kernels.ce_chunk
                if min(chunk, tokens) == min(now, tokens):  # the same chunks of the same tokens
                    same = "the recipe's value" if chunk == now else f"the same single chunk as the recipe's {now}"
                    self.note("block_sizes", f"ce_chunk={chunk}", f"with {tokens} tokens per micro-batch it is {same}")
                    continue
                self.trial("block_sizes", f"ce_chunk={chunk}", {"kernels.ce_chunk": chunk})
        else:
            self.note("block_sizes", "ce_chunk", f'the recipe\'s loss is kernels.loss = "{k.loss}": no fused_ce chunk')
        self.note("block_sizes", f"attention ({k.attention})", "titan_core exposes no block-size setting for it "
                  "(sdpa and tokamax choose their own; splash derives blocks from the sequence length)")  # fmt: skip
        moe = f'kernels.moe = "{k.moe}" exposes no grouping setting' if args.n_experts else "dense model: no MoE"
        self.note("block_sizes", "moe grouping", moe)

    # ---- 2. batch -----------------------------------------------------------------------------
    def batch(self, *, fixed_global: bool, budget: int | None, budget_source: str) -> dict:
        """The batch search from the holder's batch; the chosen batch, if larger and kept, holds."""
        trials = BatchTrials(self)
        held = self.runs.current_memory()
        total = budget + held if budget is not None else 2**62  # no budget known: memory never binds
        cap, seq = param("batch_max_tokens")[self.kind], self.cfg.training.seq_len
        doublings = max_doublings(trials.start.batch_size, seq, cap)
        result = search(trials.start, measure=trials.measure, compare=trials.compare, budget_bytes=total,
                        fraction=param("budget_fraction"), max_doublings=doublings,
                        fixed_global=fixed_global, tokens_per_row=seq, reject=trials.reject,
                        grid_end=f"{cap} tokens per micro-batch, params.batch_max_tokens")  # fmt: skip
        self.ctx.log(f"tuning: batch: {result.why}")
        kept, why = False, ""
        if result.chosen != trials.start:
            kept, why = self.settle_batch(trials, result, fixed_global)
        self.decisions += trials.decisions(result, kept, why)
        self.runs.keep_only(self.holder)
        return {**result.to_dict(), "budget_source": budget_source, "process_held_bytes": held,
                "fixed_global_batch": fixed_global}  # fmt: skip

    def settle_batch(self, trials: BatchTrials, result, fixed_global: bool) -> tuple[bool, str]:
        """Record the batch the search chose; it holds if the keep rule keeps it (its curve checked if
        rounding). (kept, why)."""
        chosen, start = result.chosen, trials.start
        label, cfg = trials.labels[chosen], trials.cfg_of(chosen)
        cls, ref = trials.classes[chosen]
        ref_cfg = with_keys(trials.start_cfg, {"training.grad_accum": chosen.rows // start.batch_size})
        curve = self.curve_check(label, cfg, ref, ref_cfg) if cls.cls == "rounding" else None
        cmp = trials.timings[chosen]
        kept, why = keep_rule(cls, cmp, curve)
        why += (f"; peak {format_bytes(self.runs.peak[label])}, limit {format_bytes(result.limit_bytes)} "
                f"({result.fraction:.0%} of the budget)")  # fmt: skip
        if not fixed_global and chosen.rows != start.rows:
            why += (f"; rows per optimizer step {start.rows} -> {chosen.rows} (the recipe fixes no global "
                    "batch: set training.grad_accum to fix one)")  # fmt: skip
        values = {"training.batch_size": chosen.batch_size, "training.grad_accum": chosen.grad_accum}
        self.record("batch", label, values, cls, ref, cmp, curve, kept, why, timed_against=trials.against[chosen])
        if kept:
            self.holder, self.cfg = label, cfg
        return kept, why

    # ---- 3. flags -----------------------------------------------------------------------------
    def flags(self, cores: int) -> list[dict]:
        rows = []
        for flag in flag_table.flags_for(self.kind, cores=cores):  # looked up per call: tests replace it
            reason = flag_table.why_not(flag, self.cfg, device=self.kind)
            row = {"flag": flag.name, "comment": flag.comment, "scope": flag.scope, "set_by": flag.render()}
            if reason is None:
                values = flag_table.recipe_values(flag, self.cfg)
                change = self.trial("flags", flag.name, values)
                row.update(tried=True, kept=change["kept"], why=change["why"], **{"class": change["class"]})
            else:
                row.update(tried=False, kept=False, why=reason)
                self.notes.append({"step": "flags", "what": flag.name, "why": reason})
            rows.append(row)
        tried = [r["flag"] for r in rows if r["tried"]]
        self.ctx.log(f"tuning: flags: {len(rows)} declared for {self.kind}, tried here: {', '.join(tried) or 'none'} "
                     "(details.flags says why each other one was not)")  # fmt: skip
        return rows


def tpu_flags_rendered(base) -> dict:
    """The TPU table as it would reach libtpu: never measured on a host without a TPU."""
    return {
        "libtpu_init_args": flag_table.libtpu_init_args(flag_table.TPU_FLAGS, base.tpu.libtpu_init_flags),
        "passed_through": "tpu.libtpu_init_flags -> LIBTPU_INIT_ARGS (titan_core.runtime.devices.resolve_device, "
                          "before torch_tpu loads)",
        "flags": [{"flag": f.name, "libtpu": list(f.libtpu), "comment": f.comment} for f in flag_table.TPU_FLAGS],
    }  # fmt: skip


# ---- the final recipe ---------------------------------------------------------------------------
def final_check(tuner: Tuner) -> dict:
    """The final recipe against the untuned one on the same rows (step 1), then run once as a whole."""
    runs, final, cfg = tuner.runs, tuner.holder, tuner.cfg
    rows = cfg.training.batch_size * cfg.training.grad_accum
    ref = tuner.matched(UNTUNED, tuner.base, rows)
    cls = classify(runs.step1[final], runs.step1[ref], rounding_rel=rounding_rel(tuner.ctx, cfg))
    b = tuner.base.training
    why = "the untuned recipe itself"
    if ref != UNTUNED:
        why = f"the untuned recipe's batch {b.batch_size} accumulated to the final recipe's {rows} rows per step"
    whole = copy.deepcopy(cfg)
    whole.training.steps = param("final_steps")
    whole.metrics.output_dir = str(tuner.ctx.attempt_dir / "final")
    with train_run.process_threads(whole.device.threads):
        _, result = train_run.train(tuner.ctx, whole, "tuning: the final recipe, run whole")
    rows_run = result.metrics
    curve = [r["loss"] for r in rows_run]
    return {
        "label": final, "baseline": ref, "baseline_why": why, "classification": cls.to_dict(),
        "step1": runs.step1[final].to_dict(), "baseline_step1": runs.step1[ref].to_dict(),
        "steps_planned": whole.training.steps, "steps_run": len(rows_run),
        "whole": not_whole(rows_run, whole.training.steps) is None,
        "stopped": result.stopped, "loss_curve": curve, "rows": rows_run,
        "metrics_file": tuner.ctx.workspace.key_for(tuner.ctx.attempt_dir / "final" / "metrics.jsonl"),
    }  # fmt: skip


def profile(tuner: Tuner) -> dict:
    """A few steady steps of the final recipe (its Trainer is warm from the timed rounds) under torch.profiler."""
    runs, label = tuner.runs, tuner.holder
    trainer, cfg = runs.trainers[label], runs.cfgs[label]
    path = tuner.ctx.attempt_dir / "profile" / "trace.json"
    try:
        with train_run.process_threads(cfg.device.threads), train_run.quiet_mesh_pickling():
            b = profile_steps(trainer.train_step, steps=param("profile_steps"), device=runs.device, trace_path=path)
    except (RuntimeError, OSError) as e:  # the profiler itself failed here: the gate's `profiled` says so
        return {"error": f"{type(e).__name__}: {e}"}
    tuner.ctx.log(f"tuning: profile of the final recipe: {b.describe()}")
    return {**b.to_dict(), "trace": tuner.ctx.workspace.key_for(path), "describe": b.describe()}


def recipe_edits(tuner: Tuner, recipe) -> list[RecipeEdit]:
    """One edit per tuned key whose final value differs from the recipe's, with the change that set it."""
    edits, steps = [], {}
    for key in TUNED_KEYS:
        now, final = get_key(recipe, key), get_key(tuner.cfg, key)
        if now == final:
            continue
        change = next(c for c in reversed(tuner.changes) if c["kept"] and key in c["values"])
        speed, steps[key] = change["describe"] or change["why"], change["step"]
        edits.append(RecipeEdit(key, final, f"tuning rung ({change['step']}): {speed}; {change['class']}"))
    threads = get_key(tuner.cfg, "device.threads")
    if "device.threads" in steps and threads > 1 and not recipe.device.adapt_threads:
        edits.append(RecipeEdit("device.adapt_threads", True, f"tuning rung ({steps['device.threads']}): "
                                f"threads={threads} was timed here; a run takes the cores free at its start, as one "
                                "busy core makes spinning threads wait on each other"))  # fmt: skip
    return edits


def summarise(tuner: Tuner, final: dict, batch: dict, prof: dict) -> TuningMeasurements:
    """The record's part of the changes tried, the final recipe against the untuned one and run whole,
    the batch it runs and its profile (`final_check`, `Tuner.batch`, `profile`)."""
    kept = [c for c in tuner.changes if c["kept"]]
    cls, t = final["classification"], tuner.cfg.training
    return TuningMeasurements(
        changes_tried=len(tuner.changes),
        changes_kept=len(kept),
        kept_changes=[f"{c['change']} ({c['class']})" for c in kept],
        kept_unmeasured=sum(c["timing"] is None or c["class"] not in ("bit_identical", "rounding") for c in kept),
        kept_diverged=sum(c["class"] == "diverged" for c in kept),
        kept_rounding_without_curve=sum(c["class"] == "rounding" and not (c["curve"] or {}).get("ok") for c in kept),
        untuned_values={k: get_key(tuner.base, k) for k in TUNED_KEYS},
        final_values={k: get_key(tuner.cfg, k) for k in TUNED_KEYS},
        final_recipe=tuner.holder,
        final_class=cls["cls"],
        final_baseline=final["baseline"],
        final_baseline_why=final["baseline_why"],
        final_step1_loss_rel_err=cls["loss_rel"],
        final_step1_grad_norm_rel_err=cls["grad_norm_rel"],
        final_step1_loss=final["step1"]["loss"],
        final_step1_grad_norm=final["step1"]["grad_norm"],
        untuned_step1_loss=final["baseline_step1"]["loss"],
        untuned_step1_grad_norm=final["baseline_step1"]["grad_norm"],
        step1_loss=final["rows"][0]["loss"] if final["rows"] else None,
        final_run_whole=final["whole"],
        final_steps_run=final["steps_run"],
        batch_size=t.batch_size,
        grad_accum=t.grad_accum,
        global_batch_size=t.batch_size * t.grad_accum,
        seq_len=t.seq_len,
        batch_stopped=batch["stopped"],
        batch_why=batch["why"],
        fixed_global_batch=batch["fixed_global_batch"],
        memory_budget_bytes=batch["budget_bytes"],
        memory_budget_source=batch["budget_source"],
        profiled="error" not in prof,
        profile_biggest=prof.get("biggest"),
        profile_lever=prof.get("lever"),
        profile_sum_rel_err=prof.get("sum_rel_err"),
        profile_within_tolerance=prof.get("sum_rel_err", math.inf) <= param("profile_sum_tolerance"),
        profile_trace=prof.get("trace"),
        timing_protocol=tuner.proto.settings(),
        device_kind=tuner.kind,
        precision=gate_recipe.precision(t),
    )  # fmt: skip


def beside_eager_tokens(final_run: SteadyRun, evidence: dict) -> TuningMeasurements:
    """The record's tokens/s against the eager rung's: the fair ratio once the batch (tokens per step) changed."""
    eager_tps = (evidence.get("eager") or {}).get("tokens_per_s")
    mine = final_run.tokens_per_s
    return TuningMeasurements(eager_tokens_per_s=eager_tps,
                              tokens_per_s_vs_eager=mine / eager_tps if eager_tps and mine else None)  # fmt: skip


def run(ctx: RungContext) -> RungResult:
    """Tune the recipe in the handbook's order, check the result whole, profile it; kept values are edits."""
    base = tuning_config(ctx)
    recipe = gate_recipe.recipe(ctx)
    args = gate_recipe.model_args(base)
    kind = gate_recipe.resolved_device_type(base.device.type)
    proto = protocol(ctx.timing_profile)
    ctx.log(f"tuning: the recipe in its own mode on {kind}, batch {base.training.batch_size} x {base.training.seq_len}"
            f"{' x ' + str(base.training.grad_accum) if base.training.grad_accum > 1 else ''}; every change timed per "
            f"token against the recipe it would change ({proto.min_rounds}-{proto.max_rounds} interleaved rounds, "
            f"{proto.confidence:.0%} interval; timing: {proto.describe_budget()})")  # fmt: skip
    tpu = tpu_flags_rendered(base)
    if kind != "tpu":
        ctx.log(f"tuning: TPU flags rendered, not run (no TPU here): LIBTPU_INIT_ARGS='{tpu['libtpu_init_args']}'")
    runs = Runs(ctx, base)
    precision = gate_recipe.precision(base.training)
    # a fresh process compiles each batch shape statically: so does this one (no dynamic-shape recompile)
    with train_run.process_threads(), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        try:
            tuner = Tuner(ctx, base, runs, kind, proto)
            tuner.block_sizes(args)
            budget, source = memory_budget(runs.device)
            fixed_global = global_batch_fixed(ctx)
            batch = tuner.batch(fixed_global=fixed_global, budget=budget, budget_source=source)
            checkpointing = try_checkpointing(tuner, batch, fixed_global=fixed_global, precision=precision)
            flag_rows = tuner.flags(cpu_count())
            final = final_check(tuner)
            prof = profile(tuner)
        finally:
            runs.close()
    edits = recipe_edits(tuner, recipe)
    final_run = run_compare.steady(final["rows"])  # the final recipe's whole run (train_run.train: never empty)
    # the record, once: the changes' and the final recipe's part, the final run's speed beside eager's, the rest
    m = TuningMeasurements.from_parts(
        summarise(tuner, final, batch, prof),
        final_run, run_compare.beside_eager(final_run, ctx.evidence), beside_eager_tokens(final_run, ctx.evidence),
        checkpoint_tried=checkpointing["tried"],
        checkpoint_why=checkpointing["why"],
        checkpoint_kept_not_exact=kept_not_exact(checkpointing, precision),
        proposed_recipe_edits=[f"{e.key}={e.value}" for e in edits],
        # what the final run had on top of the recipe as it was: the recipe as the engine leaves it on a pass
        flags=[f"--{e.key}={str(e.value).lower() if isinstance(e.value, bool) else e.value}" for e in edits],
        execution_mode=execution_mode(base),
    )  # fmt: skip
    for e in edits:
        ctx.log(f"tuning: recipe keeps {e.key} = {e.value!r} ({e.why}) if the gate passes")
    final.pop("rows")
    details = {"device": str(runs.device), "decisions": tuner.decisions, "changes": tuner.changes,
               "not_tried": tuner.notes, "batch": batch, "activation_checkpoint": checkpointing, "flags": flag_rows,
               "tpu_flags": tpu, "final": final, "profile": prof}  # fmt: skip
    return gate_recipe.result(ctx, base, m, details, edits)
