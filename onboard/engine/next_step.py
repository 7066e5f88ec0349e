"""`next-step`: run the current rung of a workspace once, under its lock, and record the attempt.

The state of every rung (onboard/ladder/states.py) decides which rung is current; the attempt
itself, from its placeholder to its judged entry, is onboard/engine/attempt.py. This is the one
place that imports a rung's runner module (`runner_of`), by the name the rung table declares.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from onboard.engine.attempt import AttemptInputs, StepOutcome, run_attempt
from onboard.ladder.contract import SHIPPED
from onboard.ladder.states import complete_message, current_state, ladder_states, passed_evidence
from onboard.ladder.table import RungSpec, default_specs
from onboard.rungs.timing_profiles import check_profile
from onboard.workspace.layout import Workspace
from onboard.workspace.ledger import Ledger, Status
from onboard.workspace.lock import WorkspaceLock


def runner_of(spec: RungSpec) -> Any:
    """The rung's runner, with its `run(ctx)`: a preloaded module-like object (tests' fakes), else the module
    the rung table names (onboard/ladder/table.py), imported here, by name, when that rung is to run (it
    imports torch and the rung's helpers); no other code imports a runner (tests/onboard/house/test_layers.py)."""
    if spec.module is None:
        spec.module = importlib.import_module(spec.module_name)
    return spec.module


def next_step(
    ws: Workspace,
    *,
    specs: list[RungSpec] | None = None,
    log: Callable[[str], None] = lambda line: None,
    base_command: str | None = None,
    timing_profile: str = SHIPPED,
) -> StepOutcome:
    """Run the current rung under the workspace lock and record the attempt in ladder.json (attempt.py).
    `timing_profile`: what the rung's keep/choose decisions are timed with (onboard/rungs/timing_profiles.py)."""
    check_profile(timing_profile)
    specs = specs or default_specs()
    with WorkspaceLock(ws.root) as lock:
        if lock.took_over:
            log(f"took over the lock left by pid {lock.took_over.get('pid')} (no longer running)")
        ledger = ws.ledger = Ledger.load(ws.ledger.path)  # re-read under the lock
        states = ladder_states(ws, specs)
        current = current_state(states)
        if current is None:
            return StepOutcome(ws.name, Status.COMPLETE, message=complete_message(states))
        spec = next(s for s in specs if s.name == current.rung)
        rerun = current.status in (Status.STALE, Status.INVALID)
        outcome = run_attempt(
            AttemptInputs(
                ws=ws,
                ledger=ledger,
                rung=spec.name,
                checklist=spec.load_checklist(),
                module=runner_of(spec),
                rerun_reason=current.reason if rerun else None,
                evidence=passed_evidence(states, spec),
                log=log,
                base_command=base_command or f"onboard next-step {ws.name}",
                not_applicable=spec.declared.not_applicable,
                timing_profile=timing_profile,
            )
        )
        if outcome.status != Status.INTERRUPTED:
            after = current_state(ladder_states(ws, specs))
            outcome.next_rung = after.rung if after else None
        return outcome
