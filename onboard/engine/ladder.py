"""The ladder: rung order, each rung's state from the ledger, and `next-step`.

State of a rung, from its latest attempt in ladder.json:

    pending         never attempted
    passed          latest attempt passed and nothing it read has changed since
    not_applicable  latest attempt said the rung does not apply (with the reason)
    stale           it passed (or was n/a), but a file it read changed, or an earlier rung
                    was re-verified after it: its evidence no longer describes the model
    invalid         the ledger says passed (or n/a), but the entry's recorded measurements
                    do not satisfy its checklist, or it has none, or they are not what the
                    attempt folder's own record says, or its times cannot be true; n/a where
                    the rung's own rule says it applies (onboard/engine/evidence.py)
    failed          latest attempt failed its gate
    interrupted     latest attempt was stopped (Ctrl-C, SIGTERM, a kill) before it finished
    running         latest attempt is in progress in a live process
    not built yet   DESIGN lists the rung but this version of onboard has no module for it

The current rung is the first built one that is not passed / not_applicable. Each status is a
`Status` (onboard/engine/ledger.py); running one attempt is onboard/engine/attempt.py.

A rung may return recipe edits (RungResult.recipe_edits, e.g. the kernels it keeps): the
engine applies them only when the gate passed, records them in the entry (`recipe_edit`:
file, sha256 before and after, each edit with its reason). Such an edit makes stale every
earlier rung whose run reads an edited key (its `reads_recipe_key`), so `next-step`
re-verifies the recipe as it now is; the rungs that do not read those keys keep their
evidence. Any other change to the recipe makes every rung that read it stale.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from onboard.engine.attempt import AttemptInputs, StepOutcome, entry_error, run_attempt
from onboard.engine.evidence import Verdict, check_entry
from onboard.engine.gates import Checklist, load_checklist
from onboard.engine.ledger import ACCEPTED, Entry, Ledger, Status, parse_iso
from onboard.workspace.layout import Workspace
from onboard.workspace.lock import WorkspaceLock, holder

__all__ = [
    "RUNGS",
    "RungSpec",
    "RungState",
    "StepOutcome",
    "default_specs",
    "entry_error",
    "ladder_states",
    "next_step",
]

RUNGS = ("eager", "parity", "simple_fsdp", "compile", "graph_trainer", "kernels", "tuning")
NOT_BUILT = Status.NOT_BUILT


@dataclass
class RungSpec:
    """How the engine reaches one rung: its module (imported lazily) and its checklist."""

    name: str
    module_name: str | None
    """Importable module path; None when the rung is not built yet."""
    module: ModuleType | Any = None
    """A preloaded module-like object with run(ctx) (tests pass fakes here)."""
    checklist: Checklist | None = None
    """A preloaded checklist; default: checklists/<name>.yaml."""

    @property
    def built(self) -> bool:
        return self.module is not None or self.module_name is not None

    def load_module(self):
        if self.module is None:
            self.module = importlib.import_module(self.module_name)
        return self.module

    def reads_recipe_key(self):
        """The rung's `reads_recipe_key(key)` (see onboard.rungs.contract), or None: it reads every key."""
        return getattr(self.load_module(), "reads_recipe_key", None)

    def load_checklist(self) -> Checklist:
        if self.checklist is None:
            self.checklist = load_checklist(self.name)
        return self.checklist


def default_specs() -> list[RungSpec]:
    """Every rung of DESIGN section 1; those with a module in onboard/rungs/ are built."""
    specs = []
    for rung in RUNGS:
        module_name = f"onboard.rungs.{rung}_rung"
        specs.append(RungSpec(rung, module_name if importlib.util.find_spec(module_name) else None))
    return specs


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


def ladder_states(ws: Workspace, specs: list[RungSpec]) -> list[RungState]:
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
    ws: Workspace, spec: RungSpec, latest: Entry, verdict: Verdict, upstream: list[tuple[str, Any]]
) -> tuple[Status, str | None]:
    """(status, reason) of a passed / not_applicable latest entry: as recorded, unless its evidence
    does not hold (invalid) or no longer describes the model (stale)."""
    if verdict.problem:
        return Status.INVALID, verdict.problem
    if changed := ws.changed_files(latest.files_read, spec.reads_recipe_key()):
        return Status.STALE, f"changed since it {latest.status}: {', '.join(changed)}"
    if newer := [r for r, ended in upstream if ended > parse_iso(latest.started)]:
        return Status.STALE, f"{', '.join(newer)} re-verified after this rung {latest.status}"
    return latest.status, latest.not_applicable_reason


def current_state(states: list[RungState]) -> RungState | None:
    """The rung next-step runs: the first built rung that is not passed / not_applicable."""
    return next((s for s in states if s.status not in ACCEPTED and s.status != NOT_BUILT), None)


def last_built(states: list[RungState]) -> str | None:
    built = [s.rung for s in states if s.status != NOT_BUILT]
    return built[-1] if built else None


def passed_evidence(states: list[RungState], rung: str) -> dict[str, dict]:
    """{rung: measurements} of the other rungs whose latest entry passed (and still holds)."""
    return {s.rung: s.latest.measurements for s in states if s.status == Status.PASSED and s.rung != rung and s.latest}


def next_step(
    ws: Workspace,
    *,
    specs: list[RungSpec] | None = None,
    log: Callable[[str], None] = lambda line: None,
    base_command: str | None = None,
) -> StepOutcome:
    """Run the current rung under the workspace lock and record the attempt in ladder.json.

    The attempt is written as an `interrupted` placeholder before the rung starts and
    replaced when it ends, so a hard kill leaves a valid ledger that says interrupted.
    Bad input from the rung removes the placeholder again (nothing written).
    """
    specs = specs or default_specs()
    with WorkspaceLock(ws.root) as lock:
        if lock.took_over:
            log(f"took over the lock left by pid {lock.took_over.get('pid')} (no longer running)")
        ledger = ws.ledger = Ledger.load(ws.ledger.path)  # re-read under the lock
        states = ladder_states(ws, specs)
        current = current_state(states)
        if current is None:
            return StepOutcome(ws.name, Status.COMPLETE, message=_complete_message(states))
        spec = next(s for s in specs if s.name == current.rung)
        rerun = current.status in (Status.STALE, Status.INVALID)
        outcome = run_attempt(
            AttemptInputs(
                ws=ws,
                ledger=ledger,
                rung=spec.name,
                checklist=spec.load_checklist(),
                module=spec.load_module(),
                rerun_reason=current.reason if rerun else None,
                evidence=passed_evidence(states, spec.name),
                log=log,
                base_command=base_command or f"onboard next-step {ws.name}",
            )
        )
        if outcome.status != Status.INTERRUPTED:
            after = current_state(ladder_states(ws, specs))
            outcome.next_rung = after.rung if after else None
        return outcome


def _complete_message(states: list[RungState]) -> str:
    if any(s.status == NOT_BUILT for s in states):
        return f"ladder complete up to the last rung that exists: {last_built(states)}"
    return "ladder complete: every rung passed or does not apply"
