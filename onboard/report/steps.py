"""The waterfall's data: each rung's speed-up as its own timing protocol measured it, and their product.

A rung's step is the speed-up of what it tried over the recipe before it (per token; at one batch,
the step-time ratio), read from the interleaved comparison its ledger entry recorded
(titan_core.measure.timing.Comparison: `ratio` candidate / baseline, `ci_low`/`ci_high` at
`confidence`, `outcome`). A rung that recorded Decisions (`details.decisions`, onboard.ladder.decision;
every keep/choose rung does now) gets the kept decisions' figures multiplied, so the bar is the figure
`status` and the summary print; none kept: the one timed decision's figure, not kept. graph_trainer's
execution-mode Decision is the mode's bar, and compile (which decides nothing) gets none. An older
ledger's records are read per rung (PER_RUNG); where no record exists the step is the ratio of two
runs timed apart (`protocol` False): context, with no interval and no outcome (gates.TIMED_APART),
drawn hatched. A timing whose interval measured nothing (gates.interval_measured) keeps its ratio
but no interval and no outcome: "interval: not measured". eager is the baseline (1x); parity times
nothing.

The cumulative product multiplies the steps the recipe kept, each measured against the recipe the
earlier kept steps left, so it telescopes to the final recipe's speed-up over eager if the changes
compose. Its interval is the product of the kept intervals' ends; by the union bound it covers the
product of the true ratios with probability at least 1 - the sum of their miss rates, whatever their
dependence. A product with a factor timed apart has no interval.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from onboard.report.facts import BASELINE, TIMED, Record, _num, decision_name, recipe_mode
from onboard.workspace.ledger import Status
from onboard.ladder.decision import KEPT
from onboard.ladder.gates import TIMED_APART, fmt_interval, interval_measured

NOT_MEASURED = "interval: not measured"
"""What stands for an interval that measured nothing (and for the outcome it cannot carry)."""
MODE_ELSEWHERE = "the execution mode is the graph_trainer rung's decision (its bar)"
NO_CHANGE = "no change kept"
MODE_RUNGS = ("compile", "graph_trainer")


@dataclass(frozen=True)
class Factor:
    """A speed-up (above 1: faster) with its interval, or a ratio of runs timed apart (no interval)."""

    speedup: float
    low: float | None = None
    high: float | None = None
    alpha: float | None = None
    """Summed miss rates (1 - confidence) of the intervals multiplied into [low, high]; None: no interval."""
    outcome: str | None = None
    """faster | slower | indistinguishable (or the comparison's "not measured"); None when timed apart
    or when the interval measured nothing: an outcome is only ever said with its interval."""
    protocol: bool = True
    """Measured by the interleaved timing protocol; False: two runs timed apart."""
    how: str = ""
    links: int = 1
    """How many recorded intervals were multiplied into this one (more than 1: the union bound's confidence)."""

    @property
    def confidence(self) -> float | None:
        return None if self.alpha is None else 1 - self.alpha

    def inverse(self) -> "Factor":
        flip = {"faster": "slower", "slower": "faster"}.get(self.outcome, self.outcome)
        low, high = (1 / self.high, 1 / self.low) if self.low is not None else (None, None)
        return dataclasses.replace(self, speedup=1 / self.speedup, low=low, high=high, outcome=flip)


ONE = Factor(1.0, 1.0, 1.0, 0.0, None, True, "", 0)


def _outcome_of(low: float | None, high: float | None) -> str | None:
    """A product's outcome from its interval alone (its factors' min_effect does not carry over); None
    where that interval is none or measured nothing (too wide: the product of wide factors)."""
    if not interval_measured(low, high):
        return None
    return "faster" if low > 1 else "slower" if high < 1 else "indistinguishable"


def product(factors: list[Factor], how: str = "") -> Factor:
    """The factors multiplied; interval and outcome as the module docstring says."""
    if len(factors) == 1 and not how:
        return factors[0]
    speedup = math.prod(f.speedup for f in factors)
    bounded = all(f.alpha is not None for f in factors) and sum(f.alpha for f in factors) < 1
    low = math.prod(f.low for f in factors) if bounded else None
    high = math.prod(f.high for f in factors) if bounded else None
    alpha = sum(f.alpha for f in factors) if bounded else None
    real = [f for f in factors if f.links]  # ONE (the start of a product, the plain path) decides nothing
    outcome = real[0].outcome if len(real) == 1 else _outcome_of(low, high)
    protocol = all(f.protocol for f in factors)
    links = sum(f.links for f in factors)
    return Factor(speedup, low, high, alpha, outcome, protocol, how or "; ".join(f.how for f in real), links)


def _rounds(record: dict) -> str:
    return f", {record['rounds']} interleaved rounds" if isinstance(record.get("rounds"), int) else ", interleaved"


def _factor(speedup: float, low, high, confidence, outcome, how: str) -> Factor:
    """A speed-up with its interval at `confidence`, or without one (and without an outcome, which
    only an interval can carry) where the interval is not usable."""
    outcome = outcome if isinstance(outcome, str) else None
    # an interval that measured nothing (not finite, a low end at 0, ends 100x apart) is no interval
    if not interval_measured(low, high) or confidence is None or not 0 < confidence < 1:
        return Factor(speedup, how=how)
    return Factor(speedup, low, high, 1 - confidence, outcome, True, how)


def link(cmp: Any, what: str = "") -> Factor | None:
    """The speed-up of one recorded interleaved Comparison (to_dict()); None for anything else
    (missing, unpaired: two runs timed apart, or a ratio that is not a positive number)."""
    if not isinstance(cmp, dict) or cmp.get("paired") is False:
        return None
    f = from_ratio(cmp.get("ratio"), cmp.get("ci_low"), cmp.get("ci_high"), cmp.get("confidence"), cmp.get("outcome"))
    return dataclasses.replace(f, how=f"{what}{_rounds(cmp)}") if f is not None else None


def from_ratio(ratio, ci_low, ci_high, confidence, outcome, how: str = "") -> Factor | None:
    """A Factor from a time ratio (candidate / baseline, above 1 slower) and its interval."""
    ratio, lo, hi = _num(ratio), _num(ci_low), _num(ci_high)
    if ratio is None or ratio <= 0:
        return None
    low, high = (1 / hi, 1 / lo) if lo is not None and hi is not None and lo > 0 else (None, None)
    return _factor(1 / ratio, low, high, _num(confidence), outcome, how)


def apart(before_s, after_s, how: str) -> Factor | None:
    """before / after of two runs timed apart; None without both."""
    before, after = _num(before_s), _num(after_s)
    if not before or not after:
        return None
    return Factor(before / after, protocol=False, how=f"{how}, timed apart")


# ---- per rung ----------------------------------------------------------------------------------
def _simple_fsdp(rec: Record, _: dict) -> tuple[Factor | None, bool | None, str]:
    m = rec.m
    what = "bf16 params vs fp32"
    factor = link(m.get("mixed_precision_timing"), f"{what}, one process")
    if factor is None:
        factor = apart(m.get("step_time_median_s"), m.get("bf16_step_time_median_s"), f"{what}, 2-process runs")
    kept = m.get("mixed_precision_choice") == "bfloat16"
    return factor, kept, f"{what}: {'bf16 kept' if kept else 'fp32 stays'}"


def decision_factor(d: dict) -> Factor | None:
    """The speed-up a Decision record holds (candidate over holder) with its interval; None when it
    has none (decided untimed, or by memory)."""
    speedup, ci = _num(d.get("speedup")), d.get("ci")
    if speedup is None or speedup <= 0:
        return None
    lo, hi = (_num(ci[0]), _num(ci[1])) if isinstance(ci, list) and len(ci) == 2 else (None, None)
    return _factor(speedup, lo, hi, _num(d.get("confidence")), d.get("outcome"), f"{decision_name(d)}{_rounds(d)}")


def _decided(rec: Record) -> tuple[Factor | None, bool | None, str]:
    """A rung that recorded Decisions: its bar is the kept decisions' figures multiplied (each was
    timed against the recipe the one before left); with none kept, the one timed decision's figure
    (the change it did not keep), if there is exactly one."""
    kept = [d for d in rec.decisions if d["verdict"] == KEPT]
    if kept:
        factors = [decision_factor(d) for d in kept]
        what = "kept " + ", ".join(decision_name(d) for d in kept)
        if any(f is None for f in factors):
            return None, True, what + ": a kept decision has no speed figure"
        return product(factors, how="; ".join(f.how for f in factors)), True, what
    timed = [(d, f) for d in rec.decisions if (f := decision_factor(d)) is not None]
    if len(timed) == 1:
        d, f = timed[0]
        return f, False, f"{decision_name(d)}: {d['verdict']}; {d['holder']} stands"
    return None, False, f"no change kept ({len(rec.decisions)} decided)"


def _mode(rec: Record, ctx: dict) -> tuple[Factor | None, bool | None, str]:
    mode, record = ctx["mode"], ctx["mode_record"]
    timing = (record.get("execution_mode_vs_eager") or {}).get(rec.rung)
    factor = link(timing, f"{rec.rung} vs eager (graph_trainer's mode choice)")
    if factor is None:
        factor = apart(ctx["eager_step_s"], rec.m.get("step_time_median_s"), f"{rec.rung}'s run vs eager's")
    kept = None if mode is None else mode == rec.rung
    verdict = "not chosen yet" if mode is None else f"{mode} chosen"
    return factor, kept, f"{rec.rung} mode vs eager: {verdict}"


def _kernel_ratio(m: dict, field: str, value: str, alpha: float | None) -> Factor | None:
    """The recorded speed-up of kernels.<field>=<value> over the plain path; 1 for the plain path itself."""
    short = f"{field}_{value}"
    if f"{short}_time_ratio" in m:
        ci = m.get(f"{short}_time_ratio_ci") or [None, None]
        conf = None if alpha is None else 1 - alpha
        return from_ratio(m[f"{short}_time_ratio"], ci[0], ci[1], conf, m.get(f"{short}_timing"))
    if any(k.startswith(short + "_") for k in m):
        return None  # compared but never timed (it failed a check): no ratio
    return ONE  # never compared: the plain path the others are timed against


def _kernel_field(m: dict, field: str, d: dict) -> Factor | None:
    """The new value against the old: their head-to-head contest, else each one's ratio against the plain path."""
    value, was = d.get("value"), d.get("was")
    what = f"kernels.{field} {was} -> {value}"
    for c in d.get("contests") or []:
        if (c.get("challenger"), c.get("holder")) == (value, was):
            return link(c.get("timing"), f"{what}, head to head")
    proto = m.get("timing_protocol") or {}
    alpha = 1 - proto["confidence"] if isinstance(proto.get("confidence"), (int, float)) else None
    new, old = _kernel_ratio(m, field, value, alpha), _kernel_ratio(m, field, was, alpha)
    if new is None or old is None:
        return None
    return product([new, old.inverse()], how=f"{what}, each timed interleaved against the plain path")


def _kernels(rec: Record, _: dict) -> tuple[Factor | None, bool | None, str]:
    edited = {f: d for f, d in rec.field_choices.items() if isinstance(d, dict) and d.get("edit")}
    if not edited:
        return None, False, "no kernel change kept"
    factors = [_kernel_field(rec.m, f, d) for f, d in edited.items()]
    if any(f is None for f in factors):
        return None, True, "kept " + ", ".join(edited) + ": not timed against the recipe before"
    what = ", ".join(f"{f}={d.get('value')}" for f, d in edited.items())
    return product(factors, how="; ".join(f.how for f in factors)), True, f"kept {what}"


def _tuning_links(rec: Record) -> list[Factor | None] | None:
    """The kept changes' comparisons, in order, each against the recipe the one before left."""
    holder, links = "untuned", []
    for c in (x for x in rec.details.get("changes") or [] if isinstance(x, dict) and x.get("kept")):
        if c.get("step") == "batch":  # the search's faster doublings, each against the one before
            tried = (rec.details.get("batch") or {}).get("tried") or []
            chain = [t.get("comparison") for t in tried if t.get("outcome") == "faster"]
        elif c.get("against") == holder:
            chain = [c.get("timing")]
        else:
            return None  # not timed against the recipe it changed
        links += [link(x, f"{c.get('change')}, per token") for x in chain]
        holder = c.get("change")
    return links


def _tuning(rec: Record, _: dict) -> tuple[Factor | None, bool | None, str]:
    links = _tuning_links(rec)
    if links == []:
        tried = len(rec.details.get("changes") or [])
        return None, False, f"no tuning change kept ({tried} tried)"
    kept = [c.get("change") for c in rec.details.get("changes") or [] if isinstance(c, dict) and c.get("kept")]
    what = "kept " + ", ".join(str(k) for k in kept)
    if links is None or any(x is None for x in links):
        return None, True, what + ": not timed against the recipe before"
    return product(links, how="; ".join(x.how for x in links)), True, what


PER_RUNG = {
    "simple_fsdp": _simple_fsdp,
    "compile": _mode,
    "graph_trainer": _mode,
    "kernels": _kernels,
    "tuning": _tuning,
}


# ---- the steps -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    label: str
    """Under the bar: the rung (`compile (stale)`), or `final recipe`."""
    rung: str
    kind: str
    """baseline | not timed | kept | not kept | not decided | final recipe."""
    what: str
    """What was timed against what, and what the ladder kept."""
    factor: Factor | None
    """This rung's speed-up over the recipe before it; None: not timed (parity), or nothing kept to time."""
    source: str
    """The rung whose ledger entry holds the timing."""
    cumulative: Factor | None
    """The product of the kept steps so far (the final recipe's is the last); None once a kept change has no timing."""

    @property
    def text(self) -> str:
        """The bar's label: speed-up, interval, outcome; or what stands instead of one."""
        return step_text(self.factor, self.kind)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def step_text(f: Factor | None, kind: str) -> str:
    if kind == "baseline":
        return "baseline 1.00x"
    if f is None:
        return "not timed" if kind == "not timed" else NO_CHANGE if kind == "not kept" else "no timing recorded"
    if not f.protocol:
        return f"{f.speedup:.2f}x {TIMED_APART}"
    if not interval_measured(f.low, f.high):  # none kept, or a product too wide to say anything
        return f"{f.speedup:.2f}x {NOT_MEASURED}"
    return f"{f.speedup:.2f}x ({fmt_interval(f.low, f.high)}) {f.outcome}"


def _context(recs: list[Record]) -> dict:
    by = {r.rung: r for r in recs if r.status in TIMED}
    eager = by.get(BASELINE)
    gt = by.get("graph_trainer")
    record = (gt.details.get("execution_mode") if gt else None) or {}
    return {
        "mode": recipe_mode(recs),
        "mode_record": record if isinstance(record, dict) else {},
        "eager_step_s": eager.m.get("step_time_median_s") if eager else None,
        # graph_trainer recorded the execution mode's Decision: its bar is that decision, compile's none
        "mode_decided": bool(gt and any(d["lever"] == "execution_mode" for d in gt.decisions)),
    }


def _kind(rec: Record, factor: Factor | None, kept: bool | None, ctx: dict) -> str:
    if rec.rung == BASELINE:
        return "baseline"
    if rec.rung not in PER_RUNG and factor is None and not rec.decisions:
        return "not timed"
    if rec.rung == "compile" and ctx["mode_decided"] and not rec.decisions:
        return "not timed"
    return "not decided" if kept is None else "kept" if kept else "not kept"


def _step(rec: Record, ctx: dict) -> tuple[Factor | None, bool | None, str]:
    """(speed-up over the recipe before, kept, what) of one rung: its Decisions where it recorded
    them, else what its older record holds (PER_RUNG)."""
    if rec.decisions:
        return _decided(rec)
    if rec.rung == "compile" and ctx["mode_decided"]:
        return None, None, MODE_ELSEWHERE
    return PER_RUNG[rec.rung](rec, ctx) if rec.rung in PER_RUNG else (None, None, "")


def waterfall_steps(recs: list[Record]) -> list[Step]:
    """One step per rung whose latest entry is passed or stale, in ladder order, then the final
    recipe (the cumulative product); [] without a passed eager baseline."""
    timed = [r for r in recs if r.status in TIMED]
    if not any(r.rung == BASELINE and _num(r.m.get("step_time_median_s")) for r in timed):
        return []
    ctx, cum = _context(recs), ONE
    steps = []
    for rec in timed:
        factor, kept, what = _step(rec, ctx)
        kind = _kind(rec, factor, kept, ctx)
        if kind == "baseline":
            factor, what = ONE, "the eager run everything is measured from"
        elif kind == "not timed" and what != MODE_ELSEWHERE:
            what = "correctness only: times nothing" if rec.rung == "parity" else "times nothing the recipe keeps"
        if kind == "kept" and cum is not None:
            cum = product([cum, factor]) if factor is not None else None
        # the modes' interleaved timings are graph_trainer's record; a ratio timed apart is the rung's own runs
        source = "graph_trainer" if rec.rung in MODE_RUNGS and factor is not None and factor.protocol else rec.rung
        label = rec.rung + (" (stale)" if rec.status == Status.STALE else "")
        steps.append(Step(label, rec.rung, kind, what, factor, source, cum))
    what = "the kept steps multiplied" if cum is not None else "a kept change has no timing: no product"
    steps.append(Step("final recipe", "final", "final recipe", what, cum, "", cum))
    return steps
