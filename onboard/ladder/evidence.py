"""The ledger is evidence, not a claim (DESIGN section 4): `check_entry` re-checks an accepted entry.

A passed entry's recorded measurements are re-evaluated against its checklist with the waivers on
the record when the attempt ended (a waiver added later does not turn an old failure into a pass; one
on finiteness or every run whole is ignored, gates.UNWAIVABLE_METRICS) and the other rungs' evidence
as it was when the attempt started (what its `evidence.<rung>.<metric>` thresholds resolved against);
its attempt folder's own record (ledger.RUN_RECORD) must say the same, and every file the pass rests
on must agree with it: the files read (files_read, never empty) and each gated run's metrics.jsonl,
re-read step by step (onboard/ladder/measurements/run_metrics.py). Its times must be possible, and its
rung's declaration may add a check (`evidence_problem`). A not_applicable entry must say why, carry
no criteria, its rung's own rule, recomputed, must agree, and it too must name the files it read.
An entry that fails any of this is `invalid`: the current rung for `next-step`, which re-runs it.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from onboard.ladder.gates import ChecklistError, evaluate
from onboard.ladder.measurements.run_metrics import record_problem
from onboard.workspace.ledger import RUN_RECORD, Entry, Ledger, Status, parse_iso, run_record
from onboard.errors import BadInput

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace

INVALID = Status.INVALID
CLOCK_SLACK = _dt.timedelta(minutes=5)
"""How far past now a recorded time may lie before it counts as invented (clocks drift a little)."""


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
    ignored = f" ({c['waiver_ignored']})" if c.get("waiver_ignored") else ""
    return f"{c['name']}: {c['metric']} = {value}, needs {bound}{ignored}"


def check_entry(entry: Entry, spec: Any, ws: "Workspace") -> Verdict:
    """Re-check one `passed` / `not_applicable` entry of `spec`'s rung (a table.RungSpec: its
    `load_checklist()` and `declared` hooks; never its runner) in `ws`; Verdict.problem says why it is invalid."""
    status, ledger = entry.status, ws.ledger
    if problem := times_problem(entry):
        return Verdict(f"ladder.json says {status}, but {problem}")
    if status == Status.NOT_APPLICABLE:
        if not str(entry.not_applicable_reason or "").strip():
            return Verdict("not_applicable with no reason recorded")
        if entry.criteria:
            return Verdict("not_applicable, yet it records criteria (a rung that does not apply evaluates none)")
        if problem := not_applicable_problem(entry.rung, spec.declared.not_applicable, ws):
            return Verdict(f"ladder.json says not_applicable, but {problem}")
        if not entry.files_read:  # staleness rests on them: an emptied list would keep it standing for ever
            return Verdict("ladder.json says not_applicable, but it records no files_read: nothing it rests on "
                           "is known")
        return Verdict(None)
    started, ended = _time(entry.started), _time(entry.ended)
    if started is None or ended is None:
        return Verdict(f"ladder.json says {status}, but it records no valid start and end time")
    if entry.error:
        return Verdict(f"ladder.json says {status}, but it records an error: {entry.error}")
    try:
        checklist = spec.load_checklist()
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
    if problem := run_folder_problem(entry, ws, spec.declared.measurements):
        return Verdict(f"ladder.json says {status}, but {problem}", criteria)
    rung_check = spec.declared.evidence_problem
    if rung_check is not None and (problem := rung_check(ws, entry)):
        return Verdict(f"ladder.json says {status}, but {problem}", criteria)
    return Verdict(None, criteria)


def times_problem(entry: Entry, now: _dt.datetime | None = None) -> str | None:
    """Why the entry's recorded times cannot be true (it ended before it started, or after now)."""
    started, ended = _time(entry.started), _time(entry.ended)
    now = now or _dt.datetime.now().astimezone()
    if started is not None and ended is not None and ended < started:
        return f"it ended ({entry.ended}) before it started ({entry.started})"
    late = [t for t in (entry.started, entry.ended) if _time(t) is not None and _time(t) > now + CLOCK_SLACK]
    if late:
        return f"its time {late[-1]} lies in the future (now is {now.isoformat(timespec='seconds')})"
    return None


def not_applicable_problem(rung: str, rule: Callable[..., str | None] | None, ws: "Workspace") -> str | None:
    """Why the rung is not shown to be not applicable to `ws` (its declared rule, recomputed now,
    says it applies, or it has no rule); None where the rule gives a reason."""
    if rule is None:
        return f"the {rung} rung has no not-applicable rule (it applies to every model)"
    try:
        reason = rule(ws, ws.recipe())
    except BadInput as e:
        return f"the {rung} rung's not-applicable rule cannot be recomputed: {e}"
    if not str(reason or "").strip():
        return f"the {rung} rung's own not-applicable rule says it applies to this workspace"
    return None


def run_folder_problem(entry: Entry, ws: "Workspace", measured: type | None = None) -> str | None:
    """Why `entry` is not what this workspace's own run of it recorded: its attempt folder is not
    runs/<rung>/attempt-<N>/ inside the workspace, that folder's RUN_RECORD is missing or says
    otherwise, or the files it rests on (files read, each run's metrics) do not agree with it
    (run_metrics.record_problem; `measured`: the rung's Measurements type); None when all agree."""
    key = f"runs/{entry.rung}/attempt-{entry.attempt}"
    folder = ws.root / key
    if entry.attempt_dir != key:
        return f"its attempt folder is recorded as {entry.attempt_dir!r}, not {key} (where the engine writes it)"
    if folder.resolve() != folder:
        return f"{folder} links outside the workspace; its evidence is another folder's"
    path = folder / RUN_RECORD
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{path} is missing: no run of this workspace recorded it"
    except (OSError, ValueError) as e:
        return f"{path} cannot be read ({type(e).__name__}: {e})"
    expected = run_record(entry)
    if not isinstance(recorded, dict):
        return f"{path} is not the record the engine writes"
    for name, value in expected.items():
        if recorded.get(name) != value:
            return f"{path}, which its run wrote, disagrees on {_differing(name, value, recorded.get(name))}"
    return record_problem(entry, recorded, f"{key}/{RUN_RECORD}", ws, measured)


def _differing(name: str, ours: Any, theirs: Any) -> str:
    """`measurements (score: 2.0 in ladder.json, 1.5 in the run folder)`: the first measurement (or
    field) that differs."""
    if name == "measurements" and isinstance(theirs, dict):
        metric = next((k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)), None)
        if metric is not None:
            here, there = ours.get(metric), theirs.get(metric)
            return f"measurements ({metric}: {here!r} in ladder.json, {there!r} in the run folder)"
    return f"{name} ({ours!r} in ladder.json, {theirs!r} in the run folder)"


def workspace_facts(ws: "Workspace") -> tuple[dict[str, Any], list[str]]:
    """({family, model_type}, mismatches): the model as the workspace's own files say it (recipe.toml's
    [model] family, config.json's model_type), and one line for each that ladder.json's workspace
    block says otherwise. Where a file cannot be read, ladder.json's value stands."""
    meta = ws.ledger.meta
    facts = {"family": ws.family, "model_type": meta.get("model_type")}
    try:
        config = json.loads((ws.root / "config.json").read_text(encoding="utf-8"))
        if isinstance(config, dict) and isinstance(config.get("model_type"), str):
            facts["model_type"] = config["model_type"]
    except (OSError, ValueError):
        pass  # status still shows something; the rungs report the broken file
    where = {"family": "recipe.toml [model] family", "model_type": "config.json model_type"}
    mismatches = [
        f"ladder.json's workspace block says {key} {meta.get(key)!r}, but {where[key]} is {facts[key]!r}"
        for key in ("family", "model_type")
        if meta.get(key) is not None and meta.get(key) != facts[key]
    ]
    return facts, mismatches
