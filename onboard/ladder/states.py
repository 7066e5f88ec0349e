"""Each rung's state from the ledger: what `status`, `list`, `report` and `next-step` start from.

State of a rung, from its latest attempt in ladder.json (DESIGN section 4):

    pending         never attempted
    passed          latest attempt passed and nothing it read has changed since
    not_applicable  latest attempt said the rung does not apply (with the reason)
    stale           it passed (or was n/a), but a file it read changed (a recipe edit counts only
                    where the rung reads an edited key), or an earlier rung whose evidence it reads
                    (table.Rung.reads_evidence) was re-verified after it
    invalid         the ledger says passed (or n/a), but its entry is not evidence (onboard/ladder/evidence.py)
    failed          latest attempt failed its gate
    interrupted     latest attempt was stopped (Ctrl-C, SIGTERM, a kill) before it finished
    running         latest attempt is in progress in a live process
    not built yet   DESIGN lists the rung but this version of onboard has no module for it

The current rung is the first built one that is not passed / not_applicable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onboard.ladder.evidence import Verdict, check_entry
from onboard.ladder.table import RungSpec
from onboard.workspace.ledger import ACCEPTED, Entry, Status, parse_iso
from onboard.workspace.lock import holder

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace

NOT_BUILT = Status.NOT_BUILT


@dataclass
class RungState:
    rung: str
    status: Status
    attempts: int
    latest: Entry | None
    reason: str | None = None
    """Why it is stale / invalid / not applicable / failed with an error; None otherwise."""
    checked: list[dict] | None = None
    """An accepted latest entry's criteria as re-evaluated from its measurements (evidence.check_entry)."""


def ladder_states(ws: "Workspace", specs: list[RungSpec]) -> list[RungState]:
    states: list[RungState] = []
    upstream: list[tuple[str, Any]] = []  # (rung, end time) of accepted earlier attempts
    running_pid = holder(ws.root)
    for spec in specs:
        entries = ws.ledger.entries(spec.name)
        latest = entries[-1] if entries else None
        if not spec.built or latest is None:
            states.append(RungState(spec.name, Status.PENDING if spec.built else NOT_BUILT, len(entries), latest))
        elif latest.status in ACCEPTED:
            verdict = check_entry(latest, spec, ws)  # the ledger is evidence, not a claim
            status, reason = _accepted_status(ws, spec, latest, verdict, upstream)
            states.append(RungState(spec.name, status, len(entries), latest, reason, verdict.criteria))
            if verdict.problem is None and latest.ended:
                upstream.append((spec.name, parse_iso(latest.ended)))
        elif latest.ended is None and latest.pid and latest.pid == running_pid:
            why = f"in progress in pid {running_pid}"
            states.append(RungState(spec.name, Status.RUNNING, len(entries), latest, why))
        else:
            states.append(RungState(spec.name, latest.status, len(entries), latest, latest.error))
    return states


def _accepted_status(
    ws: "Workspace", spec: RungSpec, latest: Entry, verdict: Verdict, upstream: list[tuple[str, Any]]
) -> tuple[Status, str | None]:
    """(status, reason) of a passed / not_applicable latest entry: as recorded, unless its evidence
    does not hold (invalid) or no longer describes the model (stale)."""
    if verdict.problem:
        return Status.INVALID, verdict.problem
    if changed := ws.changed_files(latest.files_read, spec.reads_recipe_key()):
        return Status.STALE, f"changed since it {latest.status}: {', '.join(changed)}"
    if newer := [r for r, ended in upstream if ended > parse_iso(latest.started) and spec.reads_evidence_of(r)]:
        return Status.STALE, f"{', '.join(newer)} re-verified after this rung {latest.status}"
    return latest.status, latest.not_applicable_reason


def current_state(states: list[RungState]) -> RungState | None:
    """The rung next-step runs: the first built rung that is not passed / not_applicable."""
    return next((s for s in states if s.status not in ACCEPTED and s.status != NOT_BUILT), None)


def passed_evidence(states: list[RungState], spec: RungSpec) -> dict[str, dict]:
    """{rung: measurements} of the other rungs whose latest entry passed (and still holds), where `spec`'s
    rung reads their evidence (`RungSpec.reads_evidence_of`): a rung is given only what it declares."""
    return {s.rung: s.latest.measurements for s in states
            if s.status == Status.PASSED and s.rung != spec.name and s.latest and spec.reads_evidence_of(s.rung)}  # fmt: skip


def shown_criteria(s: RungState) -> list[dict]:
    """The criteria a rung's state rests on: re-evaluated from the measurements for an
    accepted entry (so an edited ledger cannot show ok), as recorded otherwise."""
    if s.checked is not None:
        return s.checked
    return s.latest.criteria if s.latest else []


def ladder_message(states: list[RungState]) -> str:
    """One line: what next-step would do now."""
    current = current_state(states)
    if current is not None:
        verb = {
            Status.STALE: "re-verify",
            Status.INVALID: "re-run",
            Status.FAILED: "retry",
            Status.INTERRUPTED: "retry",
            Status.RUNNING: "wait for",
        }.get(current.status, "run")
        return f"next: {verb} {current.rung}"
    return complete_message(states)


def complete_message(states: list[RungState]) -> str:
    """What `next-step` and `status` say of a ladder with no current rung."""
    if any(s.status == NOT_BUILT for s in states):
        last = [s.rung for s in states if s.status != NOT_BUILT][-1:] or [None]
        return f"ladder complete up to the last rung that exists: {last[0]}"
    return "ladder complete: every rung passed or does not apply"


def entry_error(entry: Mapping[str, Any] | None) -> str | None:
    """The error an attempt (an Entry, or its JSON object) hit, as one line: the engine's (the rung
    raised) or the one the rung reported in its details (parity: the port raised, {kind, message});
    None if neither."""
    if not entry:
        return None
    if entry.get("error"):
        return str(entry["error"])
    err = (entry.get("details") or {}).get("error")
    if isinstance(err, dict) and err.get("message"):
        return f"{err.get('kind', 'rung')} error: {err['message']}"
    return str(err) if err else None
