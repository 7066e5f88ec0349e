"""The ledger is evidence, not a claim: re-check an accepted entry against its checklist.

ladder.json is a file anyone can edit. `status`, `report` and `next-step` therefore never
take an entry's `passed` on its word: `check_entry` re-evaluates the entry's recorded
measurements against the rung's checklist, with

- the waivers that were on the record when the attempt ended (a waived criterion stays ok;
  a waiver added later does not turn an old failure into a pass), and
- the evidence of the other rungs as it was when the attempt started (the latest passed
  entry of each rung that had ended by then), which threshold references such as
  `evidence.eager.step1_loss` resolve against, exactly as the engine resolved them.

A `not_applicable` entry must say why and carry no criteria. An entry that fails any of
this is `invalid` (ladder.py): it shows with the failing criterion and its value, and it is
the current rung for `next-step`, which re-runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from onboard.engine.gates import Checklist, ChecklistError, evaluate
from onboard.engine.ledger import Entry, Ledger, Status, parse_iso

INVALID = Status.INVALID


@dataclass
class Verdict:
    """Why an accepted entry is not evidence (None: it is), and the criteria as re-evaluated."""

    problem: str | None
    criteria: list[dict] = field(default_factory=list)
    """The checklist re-evaluated against the recorded measurements (empty for not_applicable)."""

    @property
    def failed(self) -> list[dict]:
        return [c for c in self.criteria if not c["ok"]]


def _time(value: str | None):
    try:
        return parse_iso(value)
    except (TypeError, ValueError):
        return None


def waivers_at(ledger: Ledger, rung: str, when) -> dict[str, dict]:
    """{criterion: waiver} of `rung` that were recorded by `when` (the latest per criterion)."""
    out: dict[str, dict] = {}
    for w in ledger.data.get("waivers", []):
        t = _time(w.get("time"))
        if w.get("rung") == rung and t is not None and t <= when:
            out[w["criterion"]] = w
    return out


def evidence_at(ledger: Ledger, rung: str, when) -> dict[str, dict]:
    """{other rung: measurements} of the latest entry of each other rung that had ended by
    `when`, where that entry passed: what the engine handed the rung as `ctx.evidence`."""
    latest: dict[str, Entry] = {}
    for e in ledger.attempts:
        ended = _time(e.ended)
        if e.rung != rung and ended is not None and ended <= when:
            latest[e.rung] = e
    return {r: e.measurements for r, e in latest.items() if e.status == Status.PASSED}


def describe(c: dict) -> str:
    """One failing criterion as a person reads it: name, recorded value, what it needs."""
    value = "not measured" if c["value"] is None else repr(c["value"])
    if c["comparator"] == "is_true":
        bound = "true"
    else:
        ref = "; ".join(filter(None, (c.get("threshold_ref"), c.get("precision") and f"the {c['precision']} bound")))
        ref = f" ({ref})" if ref else ""
        threshold = f"a threshold that is unavailable ({c['hint']})" if c["threshold"] is None else repr(c["threshold"])
        bound = f"{c['comparator']} {threshold}{ref}"
    return f"{c['name']}: {c['metric']} = {value}, needs {bound}"


def check_entry(entry: Entry, load_checklist: Callable[[], Checklist], ledger: Ledger) -> Verdict:
    """Re-check one `passed` / `not_applicable` entry; Verdict.problem says why it is invalid."""
    status = entry.status
    if status == Status.NOT_APPLICABLE:
        if not str(entry.not_applicable_reason or "").strip():
            return Verdict("not_applicable with no reason recorded")
        if entry.criteria:
            return Verdict("not_applicable, yet it records criteria (a rung that does not apply evaluates none)")
        return Verdict(None)
    started, ended = _time(entry.started), _time(entry.ended)
    if started is None or ended is None:
        return Verdict(f"ladder.json says {status}, but it records no valid start and end time")
    if entry.error:
        return Verdict(f"ladder.json says {status}, but it records an error: {entry.error}")
    try:
        checklist = load_checklist()
    except ChecklistError as e:
        return Verdict(f"its checklist cannot be read: {e}")
    waivers = waivers_at(ledger, entry.rung, ended)
    if not entry.measurements:
        criteria = evaluate(checklist, {}, {}, waivers)
        return Verdict(f"ladder.json says {status}, but it records no measurements", criteria)
    criteria = evaluate(checklist, entry.measurements, evidence_at(ledger, entry.rung, started), waivers)
    failed = [c for c in criteria if not c["ok"]]
    if failed:
        fails = "; ".join(describe(c) for c in failed)
        return Verdict(f"ladder.json says {status}, but its measurements fail {fails}", criteria)
    return Verdict(None, criteria)
