"""Checklists (`checklists/<rung>.yaml`) and their evaluation against a rung's measurements.

A checklist:

    rung: eager
    title: "..."
    criteria:
      - name: loss_falls            # unique in the rung; `onboard waive` names it
        metric: last_loss           # a declared field of the rung's Measurements
        comparator: "<"             # <=, <, >=, >, ==, is_true
        threshold: measurements.step1_loss   # a number, or a reference (below)
        hint: "symptom -> usual cause"
    human:
      - "A person checked ..."
    params:                         # the other numbers the rung runs with to decide its gate:
      steps: 20                     # step counts, keep rules, the timing protocol (`timing:`)

A threshold reference is `measurements.<metric>` (this attempt), `evidence.<rung>.<metric>`
(a passed earlier rung) or a bare metric name (this attempt). A criterion whose metric or
threshold is missing fails: nothing passes by being unmeasured.

A bound belongs to a precision (DESIGN section 5): a criterion that compares two runs of the
recipe gives `threshold: {fp32: ..., bf16: ...}` and `bound_why: {fp32: ..., bf16: ...}` (why each
is that number), and is judged with the bound of the precision the attempt's runs computed in (its
`precision` measurement); an attempt that recorded none fails it, and the result names the
precision and the reason of the bound it used.

Three optional keys say more of a criterion (DESIGN section 5):

    checks: "what the criterion compares, in words"   # carried into every evaluated record
    not_applicable_when: {metric: step1_loss_reference, startswith: "none", why: "..."}
                                    # the criterion has nothing to compare: shown as not applicable with
                                    # `why`, never as a passing number
    waivable: false                 # `onboard waive` refuses it and a waiver on record is ignored

Finiteness and "every run whole" (UNWAIVABLE_METRICS) are never waivable, whatever a file says:
a waived NaN would make a run that proves nothing read as passed.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import yaml

from onboard.ladder.contract import Measurements
from onboard.workspace.resources import data_file
from titan_core.measure.timing import INTERVAL_RATIO_CAP  # the one cap: a comparison this wide is not measured

COMPARATORS = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
    "is_true": None,
}


PRECISIONS = ("fp32", "bf16")
"""The precisions a recipe computes in (onboard.rungs.gate_recipe.precision): every per-precision
threshold names both."""


UNWAIVABLE_METRICS = frozenset({"all_finite", "runs_whole", "final_run_whole"})
"""Metrics whose criterion no waiver can turn ok: every planned step ran, every loss and grad norm
finite. A gate whose run broke proves nothing of the steps it did not run, so "waived" would be a
pass with no evidence behind it. A checklist may mark more criteria `waivable: false`, never fewer."""

class ChecklistError(ValueError):
    """A malformed checklist file: a bug in the shipped data, never the user's input."""


@dataclass(frozen=True)
class Criterion:
    name: str
    metric: str
    comparator: str
    threshold: Any
    """A number or reference; or {precision: number or reference} (`per_precision`)."""
    hint: str
    bound_why: dict[str, str] = field(default_factory=dict)
    """{precision: why the bound is that number}, for a per-precision threshold."""
    checks: str = ""
    """What the criterion compares, in words (the checklist's `checks:`); "" where the name says it."""
    not_applicable_when: dict[str, str] | None = None
    """{metric, startswith, why}: when the attempt's `metric` starts with `startswith`, there is nothing
    to compare and the criterion is recorded as not applicable with `why` (no value, no pass figure)."""
    waivable_in_file: bool = True
    """The checklist's `waivable:` (default true); `waivable` also holds UNWAIVABLE_METRICS."""

    @property
    def per_precision(self) -> bool:
        return isinstance(self.threshold, dict)

    @property
    def waivable(self) -> bool:
        return self.waivable_in_file and self.metric not in UNWAIVABLE_METRICS

    def unwaivable_why(self) -> str:
        """Why a waiver of this criterion is refused (or ignored), one line."""
        if self.metric in UNWAIVABLE_METRICS:
            return (f"{self.name} cannot be waived: a run that stopped early or logged a non-finite value proves "
                    "nothing of the steps it did not run")
        return f"{self.name} cannot be waived (its checklist marks it waivable: false)"

    def not_applicable_why(self, measurements: Mapping[str, Any]) -> str | None:
        """Why the criterion does not apply to these measurements (`not_applicable_when`); None: it applies."""
        rule = self.not_applicable_when
        if not rule:
            return None
        value = measurements.get(rule["metric"])
        if isinstance(value, str) and value.startswith(rule["startswith"]):
            return rule["why"]
        return None

    def bound(self, precision: str | None) -> tuple[Any, str | None, str | None]:
        """(threshold, why, problem) for a run in `precision`: the one threshold, or the precision's own."""
        if not self.per_precision:
            return self.threshold, None, None
        if precision not in self.threshold:
            return None, None, (
                f"the bound depends on the precision and the attempt recorded {precision!r} "
                f"(one of {', '.join(PRECISIONS)} expected)"
            )
        return self.threshold[precision], self.bound_why.get(precision), None


@dataclass(frozen=True)
class Checklist:
    rung: str
    title: str
    criteria: tuple[Criterion, ...]
    human: tuple[str, ...] = field(default_factory=tuple)
    params: dict[str, Any] = field(default_factory=dict)
    """`params:` of the file: the numbers the rung runs with (a checklist is the one place for them)."""

    def param(self, name: str) -> Any:
        """One of `params`; a missing one is a bug in the shipped checklist, named as such."""
        if name not in self.params:
            raise ChecklistError(f"checklists/{self.rung}.yaml: params has no '{name}' (has: {', '.join(self.params)})")
        return self.params[name]

    def criterion(self, name: str) -> Criterion | None:
        return next((c for c in self.criteria if c.name == name), None)


def parse_checklist(data: Any, source: str) -> Checklist:
    """Validate a loaded YAML document; ChecklistError names the file and the problem."""
    if not isinstance(data, dict):
        raise ChecklistError(f"{source}: expected a mapping at the top level")
    for key in ("rung", "criteria"):
        if key not in data:
            raise ChecklistError(f"{source}: missing '{key}'")
    criteria, seen = [], set()
    for i, item in enumerate(data["criteria"] or []):
        where = f"{source}: criteria[{i}]"
        if not isinstance(item, dict):
            raise ChecklistError(f"{where}: expected a mapping")
        missing = [k for k in ("name", "metric", "comparator", "hint") if not item.get(k)]
        if missing:
            raise ChecklistError(f"{where}: missing {', '.join(missing)}")
        if item["comparator"] not in COMPARATORS:
            raise ChecklistError(f"{where}: comparator '{item['comparator']}' not in {', '.join(COMPARATORS)}")
        threshold, bound_why = item.get("threshold"), item.get("bound_why") or {}
        if isinstance(threshold, dict):
            _check_per_precision(where, item["name"], threshold, bound_why)
        elif item["comparator"] != "is_true" and not isinstance(threshold, (int, float, str)):
            raise ChecklistError(f"{where}: '{item['name']}' needs a threshold (number or reference)")
        if item["name"] in seen:
            raise ChecklistError(f"{where}: duplicate criterion name '{item['name']}'")
        seen.add(item["name"])
        criteria.append(Criterion(item["name"], item["metric"], item["comparator"], threshold, item["hint"].strip(),
                                  {k: " ".join(str(v).split()) for k, v in bound_why.items()},
                                  " ".join(str(item.get("checks") or "").split()),
                                  _not_applicable_rule(where, item), _waivable(where, item)))  # fmt: skip
    if not criteria:
        raise ChecklistError(f"{source}: no criteria (a gate with nothing to check would pass vacuously)")
    human = tuple(str(h) for h in (data.get("human") or []))
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise ChecklistError(f"{source}: params must be a mapping of name -> value")
    return Checklist(str(data["rung"]), str(data.get("title", data["rung"])), tuple(criteria), human, dict(params))


def _not_applicable_rule(where: str, item: dict) -> dict[str, str] | None:
    """A criterion's `not_applicable_when` ({metric, startswith, why}, each text), or None."""
    rule = item.get("not_applicable_when")
    if rule is None:
        return None
    if not isinstance(rule, dict) or set(rule) != {"metric", "startswith", "why"} or not all(
        isinstance(v, str) and v.strip() for v in rule.values()
    ):
        raise ChecklistError(f"{where}: not_applicable_when must be {{metric, startswith, why}}, each text")
    return {k: " ".join(v.split()) if k == "why" else v for k, v in rule.items()}


def _waivable(where: str, item: dict) -> bool:
    value = item.get("waivable", True)
    if not isinstance(value, bool):
        raise ChecklistError(f"{where}: waivable must be true or false")
    return value


def _check_per_precision(where: str, name: str, threshold: dict, bound_why: Any) -> None:
    """A per-precision threshold names every precision, each with a number or reference and its reason."""
    if set(threshold) != set(PRECISIONS):
        raise ChecklistError(f"{where}: '{name}' threshold per precision must name exactly {', '.join(PRECISIONS)}")
    if any(not isinstance(v, (int, float, str)) or isinstance(v, bool) for v in threshold.values()):
        raise ChecklistError(f"{where}: '{name}' threshold per precision: each must be a number or reference")
    if not isinstance(bound_why, dict) or set(bound_why) != set(PRECISIONS):
        raise ChecklistError(f"{where}: '{name}' needs bound_why for each of {', '.join(PRECISIONS)}")


def load_checklist(rung: str, path: Path | None = None) -> Checklist:
    """The shipped checklist of `rung` (or the file at `path`)."""
    path = path or data_file("checklists", f"{rung}.yaml")
    if not path.is_file():
        raise ChecklistError(f"no checklist for rung '{rung}' at {path}")
    checklist = parse_checklist(yaml.safe_load(path.read_text()), str(path))
    if checklist.rung != rung:
        raise ChecklistError(f"{path}: says rung '{checklist.rung}', expected '{rung}'")
    return checklist


def _number(value: Any) -> float | None:
    """Numbers as floats; numeric strings (repr floats, "nan") parsed; anything else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def resolve_threshold(threshold: Any, measurements: dict, evidence: dict) -> tuple[Any, str | None]:
    """(value, problem): the threshold's numeric value, or None and why it is unavailable."""
    if not isinstance(threshold, str):
        return threshold, None
    if threshold.startswith("evidence."):
        parts = threshold.split(".", 2)
        if len(parts) != 3:
            return None, f"threshold reference '{threshold}' is not evidence.<rung>.<metric>"
        _, rung, metric = parts
        if rung not in evidence:
            return None, f"threshold needs {threshold}, but rung '{rung}' has no passed evidence"
        if metric not in evidence[rung]:
            return None, f"threshold needs {threshold}, but rung '{rung}' did not record '{metric}'"
        return evidence[rung][metric], None
    metric = threshold.removeprefix("measurements.")
    if metric not in measurements:
        return None, f"threshold needs '{metric}', which this attempt did not measure"
    return measurements[metric], None


def check_value(c: Criterion, value: Any, threshold: Any) -> tuple[bool, str | None]:
    """(ok, problem) for one comparison; problem explains a failure that is not a plain miss."""
    if c.comparator == "is_true":
        if not isinstance(value, bool):
            return False, f"expected true/false, got {value!r}"
        return value, None
    v, t = _number(value), _number(threshold)
    if v is None:
        return False, f"measured value {value!r} is not a number"
    if t is None:
        return False, f"threshold {threshold!r} is not a number"
    if math.isnan(v) or math.isnan(t):
        return False, "value or threshold is NaN"
    return bool(COMPARATORS[c.comparator](v, t)), None


def evaluate(
    checklist: Checklist,
    measurements: Measurements | Mapping[str, Any],
    evidence: dict | None = None,
    waivers: dict[str, dict] | None = None,
) -> list[dict]:
    """One result per criterion: {name, metric, comparator, value, threshold, threshold_ref, precision,
    bound_why, ok, raw_ok, hint, waived, why, checks, not_applicable, waiver_ignored} (precision and
    bound_why: None unless the bound is per precision).

    `measurements`: a rung's declared Measurements, or the flat dict a ledger entry recorded
    (its `as_metrics()`). `waivers` maps criterion name -> waiver record; a waived criterion is
    ok (raw_ok keeps what the measurement alone said) and carries the waiver's reason, except one
    that cannot be waived (`Criterion.waivable`): its waiver is ignored and `waiver_ignored` says so.
    A criterion with nothing to compare (`not_applicable_when`) is ok with no value, and
    `not_applicable` says why.
    """
    if isinstance(measurements, Measurements):
        measurements = measurements.as_metrics()
    evidence, waivers = evidence or {}, waivers or {}
    return [_evaluate_one(c, measurements, evidence, waivers.get(c.name)) for c in checklist.criteria]


def _evaluate_one(c: Criterion, measurements: Mapping[str, Any], evidence: dict, waiver: dict | None) -> dict:
    hint = c.hint
    precision = measurements.get("precision") if c.per_precision else None
    spec, bound_why, problem = c.bound(precision)
    if problem is None:
        threshold, problem = (
            (None, None) if c.comparator == "is_true" else resolve_threshold(spec, measurements, evidence)
        )
    else:
        threshold = None
    not_applicable = c.not_applicable_why(measurements)
    if not_applicable:  # nothing to compare: no number that reads as a pass
        value, raw_ok = None, True
    elif c.metric not in measurements or measurements[c.metric] is None:
        value, raw_ok, hint = None, False, f"rung did not measure {c.metric}"
    elif problem:
        value, raw_ok, hint = measurements[c.metric], False, problem
    else:
        value = measurements[c.metric]
        raw_ok, problem = check_value(c, value, threshold)
        if problem:
            hint = f"{problem}; {hint}"
    ignored = None
    if waiver is not None and not c.waivable:
        ignored, waiver = f"the waiver on record ({waiver.get('why')}) is ignored: {c.unwaivable_why()}", None
    return {
        "name": c.name,
        "metric": c.metric,
        "comparator": c.comparator,
        "value": value,
        "threshold": None if not_applicable else threshold,
        "threshold_ref": spec if isinstance(spec, str) else None,
        "precision": precision,
        "bound_why": bound_why,
        "ok": raw_ok or waiver is not None,
        "raw_ok": raw_ok,
        "hint": hint,
        "waived": waiver is not None,
        "why": waiver["why"] if waiver else None,
        "checks": c.checks or None,
        "not_applicable": not_applicable,
        "waiver_ignored": ignored,
    }


def gate_passed(results: list[dict]) -> bool:
    return all(r["ok"] for r in results)


def fmt(value: Any) -> str:
    """Short human form of a measurement: 6 significant digits, ints with separators."""
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return repr(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3e}"
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        text = str(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


# A recorded criterion is sure to have a name and ok (ledger.shape_problem); the rest of
# what evaluate() writes may be missing from a hand-edited entry, so it is read with get.
def fmt_value(c: dict) -> str:
    """A criterion's value as a person reads it: "not applicable" where it had nothing to compare."""
    return "not applicable" if c.get("not_applicable") else fmt(c.get("value"))


def fmt_threshold(c: dict) -> str:
    if c.get("not_applicable"):
        return f"not applicable: {c['not_applicable']}"
    if c.get("comparator") == "is_true":
        return "is true"
    ref = "; ".join(filter(None, (c.get("threshold_ref"), c.get("precision") and f"{c['precision']} bound")))
    return f"{c.get('comparator', '?')} {fmt(c.get('threshold'))}" + (f" ({ref})" if ref else "")


# ---- intervals -------------------------------------------------------------------------------
def interval_measured(low: Any, high: Any) -> bool:
    """Whether [low, high] is an interval a person can use: two finite numbers, 0 < low <= high, and
    high / low at most INTERVAL_RATIO_CAP (a wider one is a timing that measured nothing)."""
    lo, hi = _number(low), _number(high)
    if lo is None or hi is None or isinstance(low, str) or isinstance(high, str):
        return False
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi < lo:
        return False
    return hi / lo <= INTERVAL_RATIO_CAP


def fmt_interval(low: Any, high: Any, digits: int = 2) -> str:
    """"1.21-1.38", or "not measured" where the interval is not one (`interval_measured`): the one
    way status, recipe and the report print an interval."""
    if not interval_measured(low, high):
        return "not measured"
    return f"{float(low):.{digits}f}-{float(high):.{digits}f}"


TIMED_APART = "context (timed apart, no interval)"
"""The label of a ratio of two runs timed apart, wherever one is printed or recorded. Load moves
runs timed minutes apart as much as a change can, so nothing bounds their ratio: it carries no
interval and no faster / slower / indistinguishable (only an interleaved, paired
titan_core.measure.timing.compare does, DESIGN section 7), and never decides."""


def fmt_seconds(s: float | None) -> str:
    """A step time as a person reads it: "41 ms", "1.20 s", "not recorded"."""
    if s is None:
        return "not recorded"
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def timed_apart(candidate_s: Any, baseline_s: Any, baseline: str, candidate: str = "") -> str:
    """Two runs' median step times side by side as context, e.g. "context (timed apart, no interval):
    median step 41 ms against eager's 63 ms, 1.54x" (the baseline's time over the candidate's: above 1
    the candidate's steps took less time); without both times, which one is missing."""
    cand, base = _seconds(candidate_s), _seconds(baseline_s)
    if cand is None or base is None:
        missing = baseline if base is None else candidate or "this run"
        return f"{TIMED_APART}: no ratio ({missing} recorded no step time)"
    whose = f"{candidate}'s median step" if candidate else "median step"
    return f"{TIMED_APART}: {whose} {fmt_seconds(cand)} against {baseline}'s {fmt_seconds(base)}, {base / cand:.2f}x"


def _seconds(value: Any) -> float | None:
    """A recorded time that can be divided by: a finite, positive number (a hand edit may hold anything)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number and math.isfinite(value) and value > 0 else None


def comparison_line(cmp: Any, candidate: str, baseline: str) -> str:
    """One interleaved comparison (a titan_core.measure.timing.Comparison) in a line: its describe(),
    unless its interval measured nothing (`interval_measured`), which describe() would print as is
    (0.00-512246.96): then no interval and no outcome, "not measured"."""
    if interval_measured(cmp.ci_low, cmp.ci_high):
        return cmp.describe(candidate, baseline)
    why = cmp.not_measured_why or "its interval is not finite or too wide to say anything"
    return f"{candidate} against {baseline}: interval not measured ({why}; {cmp.rounds} rounds)"


def measured_decision(d: dict) -> dict:
    """A Decision record (onboard.ladder.decision) as views print it: an interval that is not
    measured (`interval_measured`) is dropped, with its speed-up, so the headline says "not measured"."""
    ci = d.get("ci")
    if ci is None or (isinstance(ci, list) and len(ci) == 2 and interval_measured(*ci)):
        return d
    return {**d, "ci": None, "speedup": None}
