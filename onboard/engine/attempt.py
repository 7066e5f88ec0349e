"""One attempt of the current rung, from its placeholder in ladder.json to its judged entry.

`run_attempt` reads top to bottom, as DESIGN section 4 lists the steps of one `next-step`: open
(attempt folder, `interrupted` placeholder saved), call the rung (SIGTERM raising like Ctrl-C; bad
input withdraws the attempt), take its result (file hashes, measurements, also into the attempt
folder's ledger.RUN_RECORD), judge (not_applicable only where the rung's declared rule agrees, else
the checklist; a passed gate's recipe edits are written then) and close (the entry replaces the
placeholder). An interrupt records it interrupted, exit 128 + the signal, also where the rung took
it for a failure of its own (a child process the same signal stopped); an OS error or a crash fails it.

The ledger is written twice per attempt, each time a whole entry: the placeholder before the rung runs
(`Ledger.add_placeholder`), and after it the entry the steps built as one value (`Ledger.commit`; for bad
input `Ledger.withdraw`). Between the two the attempt reads the ledger only for its waivers.
"""

from __future__ import annotations

import os
import platform
import shutil
import traceback
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from titan_core.config.loader import ConfigError

from onboard.ladder.gates import Checklist, evaluate, gate_passed
from onboard.ladder.evidence import not_applicable_problem
from onboard.workspace.ledger import RUN_RECORD, Entry, Ledger, Status, duration_of, now_iso
from onboard.ladder.measurements.run_metrics import attempt_record_text, seal_runs, shown_runs
from onboard.ladder.recipe_edit import RecipeEditError, apply_edits
from onboard.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PASSED,
    BadInput,
    EnvironmentFailed,
    Interrupted,
    describe_os_error,
    interrupt_signal,
    interrupted_exit_code,
    signal_name,
    signals_raise,
)
from onboard.ladder.contract import SHIPPED, Measurements, RecipeEdit, RungContext, RungResult, settle_runs
from onboard.ladder.states import entry_error
from onboard.ladder.table import TABLE, earns_key
from onboard.rungs.timing_profiles import timing_record
from onboard.workspace.fsutil import atomic_write_text

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace

EXIT_CODES = {
    Status.PASSED: EXIT_PASSED,
    Status.NOT_APPLICABLE: EXIT_PASSED,
    Status.COMPLETE: EXIT_PASSED,
    Status.FAILED: EXIT_FAILED,
    Status.INTERRUPTED: EXIT_INTERRUPTED,
}


@dataclass
class StepOutcome:
    """What next-step did; `exit_code` follows DESIGN section 4 (128 + the signal for interrupted)."""

    workspace: str
    status: Status
    """passed | failed | not_applicable | interrupted | complete"""
    rung: str | None = None
    attempt: int | None = None
    criteria: list[dict] = field(default_factory=list)
    human: list[str] = field(default_factory=list)
    message: str = ""
    entry: Entry | None = None
    next_rung: str | None = None
    os_error: str | None = None
    """The OS error the attempt stopped on (disk full, a file it could not read): the
    attempt is recorded failed, and the CLI says this in one line instead of the criteria."""
    signum: int | None = None
    """The signal an interrupted attempt stopped on (SIGINT, SIGTERM): its exit code is 128 + it."""

    @property
    def exit_code(self) -> int:
        if self.status == Status.INTERRUPTED and self.signum:
            return interrupted_exit_code(self.signum)
        return EXIT_CODES.get(self.status, EXIT_BAD_INPUT)

    def to_json(self) -> dict:
        entry = self.entry
        failed = [c for c in self.criteria if not c["ok"]]
        return {
            "workspace": self.workspace,
            "rung": self.rung,
            "attempt": self.attempt,
            "status": self.status,
            "message": self.message,
            "criteria": self.criteria,
            "failed": [c["name"] for c in failed],
            "hints": {c["name"]: c["hint"] for c in failed},
            "waived": [c["name"] for c in self.criteria if c.get("waived")],
            "measurements": entry.measurements if entry else {},
            "details": entry.details if entry else {},
            "error": entry_error(entry),
            "attempt_dir": entry.attempt_dir if entry else None,
            "next_rung": self.next_rung,
            "human_checks": self.human,
            "recipe_edit": entry.recipe_edit if entry else None,
            "os_error": self.os_error,
            "exit_code": self.exit_code,
        }


@dataclass
class AttemptInputs:
    """What one attempt of the current rung needs, gathered by `next_step` under the workspace lock."""

    ws: "Workspace"
    ledger: Ledger
    """The ledger as re-read under the lock; the attempt is recorded in it."""
    rung: str
    module: ModuleType | Any
    """The rung's module (or a module-like fake): its `run(ctx) -> RungResult`."""
    checklist: Checklist
    """checklists/<rung>.yaml, which judges the attempt."""
    rerun_reason: str | None
    """Why the rung runs again (it was stale or invalid); None for a first attempt or a retry."""
    evidence: dict[str, dict]
    """{rung: measurements} of the other rungs that passed: the rung's `ctx.evidence`, and what
    the checklist's `evidence.<rung>.<metric>` thresholds resolve against."""
    log: Callable[[str], None]
    base_command: str
    """The command recorded when the rung names none (`onboard next-step <name>`)."""
    not_applicable: Callable[..., str | None] | None = None
    """The rung's declared not-applicable rule (onboard/ladder/table.py); None: it applies to every model."""
    timing_profile: str = SHIPPED
    """The timing profile the rung's keep/choose decisions are timed with (onboard/rungs/timing_profiles.py)."""


@dataclass
class Failure:
    """Why an attempt has no result to judge, or why a passed gate's recipe edit was not written."""

    error: str
    traceback_key: str | None
    """Workspace key of the attempt's error.txt; None where the disk refused that too."""
    os_error: bool = False
    """The OS stopped it (disk full, an unreadable file): the CLI says so in one line."""

    def entry_text(self) -> str:
        if self.traceback_key:
            return f"{self.error} (traceback: {self.traceback_key})"
        return f"{self.error} (no traceback: error.txt could not be written)"


def run_attempt(run: AttemptInputs) -> StepOutcome:
    """Run the current rung once and record the attempt (the module docstring's steps): the placeholder is
    saved before the rung runs; after it, the entry is built as one value and committed once."""
    placeholder, attempt_dir = _open(run)
    ctx = RungContext(workspace=run.ws, attempt_dir=attempt_dir, evidence=run.evidence, log=run.log,
                      timing_profile=run.timing_profile)  # fmt: skip
    try:
        with signals_raise() as received:
            outcome = _call_rung(run, placeholder, ctx)
    except (KeyboardInterrupt, Interrupted) as e:
        return _interrupted(run, placeholder, interrupt_signal(e), type(e).__name__)
    if received:  # the rung took the signal for a failure of its own (a child it stopped too): still interrupted
        return _interrupted(run, placeholder, received[0], f"the rung ended on it as {_ended_as(outcome)}")
    entry = _ended(placeholder)
    if isinstance(outcome, RungResult):
        entry, outcome = _take(run, entry, outcome, attempt_dir, ctx.runs)
    if isinstance(outcome, RungResult) and outcome.not_applicable:
        failure = None
        entry = replace(entry, status=Status.NOT_APPLICABLE, not_applicable_reason=str(outcome.not_applicable))
        message = f"{run.rung} does not apply: {outcome.not_applicable}"
    else:
        entry, failure = _judge(run, entry, outcome, attempt_dir)
        message = f"{run.rung} {entry.status} (attempt {entry.attempt})"
    return _close(run, entry, failure, message)


# ---- the steps --------------------------------------------------------------------------------
# Each step after the rung returns takes the entry so far and returns a new one (dataclasses.replace, its
# dicts copied, never shared): the placeholder in the ledger stays as it was saved until `_close` commits
# the whole entry in its place, so the ledger is written twice per attempt, each time a whole entry.
def _open(run: AttemptInputs) -> tuple[Entry, Path]:
    """A fresh attempt folder and the `interrupted` placeholder, saved (an unwritable ledger raises, nothing left)."""
    attempt = run.ledger.next_attempt(run.rung)
    attempt_dir = run.ws.runs_dir / run.rung / f"attempt-{attempt}"
    if attempt_dir.exists():
        shutil.rmtree(attempt_dir)  # left by an attempt that was withdrawn as bad input
    attempt_dir.mkdir(parents=True)
    run.log(f"{run.rung}: attempt {attempt}" + (f" (re-verifying: {run.rerun_reason})" if run.rerun_reason else ""))
    placeholder = Entry(
        rung=run.rung,
        attempt=attempt,
        status=Status.INTERRUPTED,  # until the rung returns: a hard kill leaves this
        started=now_iso(),
        pid=os.getpid(),
        command=run.base_command,
        attempt_dir=run.ws.key_for(attempt_dir),
        environment=environment(run.ws.device),
        model=run.ws.model_label(),  # the twin or the full model: every rung says which it ran
        rerun_reason=run.rerun_reason,
    )
    try:
        run.ledger.add_placeholder(placeholder)
    except OSError:
        # nothing could be recorded, so nothing ran: the CLI says why (a read-only
        # workspace is the input's fault, a full disk the machine's)
        _remove_attempt_dir(run.ws, attempt_dir)
        raise
    return placeholder, attempt_dir


def _call_rung(run: AttemptInputs, placeholder: Entry, ctx: RungContext) -> RungResult | Failure:
    """The rung's checked result, or the failure it ended in; bad input withdraws the attempt and raises."""
    try:
        return _check_result(run.module.run(ctx))
    except (BadInput, ConfigError) as e:
        # the recipe (or a file it names) is bad input, whichever rung found it: exit 2, nothing recorded
        _record(run.ledger, f"{run.rung} attempt {placeholder.attempt} was withdrawn as bad input ({e})",
                lambda: run.ledger.withdraw(run.rung, placeholder.attempt))  # fmt: skip
        _remove_attempt_dir(run.ws, ctx.attempt_dir)
        if isinstance(e, ConfigError):  # the loader names the recipe when the error is in it
            named = str(e).startswith(str(run.ws.recipe_path))
            raise BadInput(str(e) if named else f"{run.ws.recipe_path}: {e}") from None
        raise
    except OSError as e:
        # the disk filled up, a file could not be read or written: the attempt could not finish,
        # which is failed (interrupted means a signal), and the CLI says so in one line
        return Failure(f"{type(e).__name__}: {e}", _write_error(run.ws, ctx.attempt_dir), os_error=True)
    except Exception as e:  # the model crashed: that is a failed gate the porter must fix, not a warning
        return Failure(f"{type(e).__name__}: {e}", _write_error(run.ws, ctx.attempt_dir))


def _interrupted(run: AttemptInputs, placeholder: Entry, signum: int, how: str) -> StepOutcome:
    """Record the attempt interrupted by `signum` (no gate result, whatever the rung measured); `how`:
    the exception it arrived as, or what the rung made of it."""
    entry = replace(placeholder, status=Status.INTERRUPTED, ended=now_iso(),
                    error=f"interrupted by {signal_name(signum)} ({how})")  # fmt: skip
    _record(run.ledger, f"{run.rung} attempt {entry.attempt} was interrupted", lambda: run.ledger.commit(entry))
    message = f"{run.rung} attempt {entry.attempt} interrupted by {signal_name(signum)}"
    return StepOutcome(run.ws.name, Status.INTERRUPTED, run.rung, entry.attempt, message=message, entry=entry,
                       signum=signum)  # fmt: skip


def _ended_as(outcome: "RungResult | Failure") -> str:
    """What a rung that went on after a signal returned, in a few words (a failure's first line)."""
    return (outcome.error.splitlines() or ["a failure"])[0] if isinstance(outcome, Failure) else "a result"


def _ended(placeholder: Entry) -> Entry:
    ended = now_iso()
    return replace(placeholder, ended=ended, duration_s=duration_of(placeholder.started, ended))


def _take(run: AttemptInputs, entry: Entry, result: RungResult, attempt_dir: Path,
          runs: list[dict]) -> tuple[Entry, RungResult | Failure]:  # fmt: skip
    """(the entry with what the rung returned, the result or the failure it comes to): the file hashes, the
    rung's record serialised once (with whether every gated run it recorded ran whole, `runs`: the rung's
    `ctx.runs`) and written to the attempt folder too; a failure where the files it read cannot be
    fingerprinted or that record cannot be written."""
    try:
        files_read = run.ws.hashes(result.files_read)
    except OSError as e:
        error = f"the files the rung read cannot be fingerprinted: {type(e).__name__}: {e}"
        return entry, Failure(error, _write_error(run.ws, attempt_dir), os_error=True)
    settle_runs(result.measurements, runs)
    sealed = seal_runs(run.ws, runs, attempt_dir)  # each run's metrics file named, with its sha256: readers re-read it
    # the timing profile it decided with
    details = {**result.details, **timing_record(run.checklist, run.timing_profile)}
    if runs:
        details["gated_runs"] = shown_runs(sealed)
    entry = replace(
        entry,
        command=result.command or run.base_command,
        files_read=files_read,
        measurements=result.measurements.as_metrics(),  # the rung's record, serialised once
        details=details,
        environment={**entry.environment, "device": str(result.details.get("device", run.ws.device))},
    )
    try:  # the attempt folder's own copy: a ledger entry without it is no evidence (evidence.check_entry)
        atomic_write_text(attempt_dir / RUN_RECORD, attempt_record_text(entry, sealed))
    except OSError as e:
        error = f"{RUN_RECORD} could not be written: {type(e).__name__}: {e}"
        return entry, Failure(error, _write_error(run.ws, attempt_dir), os_error=True)
    if result.not_applicable and (problem := not_applicable_problem(run.rung, run.not_applicable, run.ws)):
        # the rung's word alone is not enough: status re-checks the same rule later
        error = f"the rung returned not_applicable ({result.not_applicable}), but {problem}"
        return entry, Failure(error, _write_error(run.ws, attempt_dir, f"{error}\n"))
    return entry, result


def _judge(run: AttemptInputs, entry: Entry, outcome: RungResult | Failure,
           attempt_dir: Path) -> tuple[Entry, Failure | None]:  # fmt: skip
    """(the entry judged passed / failed, the failure or None): the checklist evaluated; a passed gate's
    recipe edits are written here and recorded with the recipe's hash after them."""
    waivers = {c: w for (_, c), w in run.ledger.waivers(run.rung).items()}
    criteria = evaluate(run.checklist, entry.measurements, run.evidence, waivers)
    failure = outcome if isinstance(outcome, Failure) else None
    recipe_edit, files_read = None, entry.files_read
    if failure is None and gate_passed(criteria) and outcome.recipe_edits:
        # only a passed gate edits the recipe; an edit that cannot be applied fails the attempt
        recipe_edit, failure = _apply_recipe_edits(run, outcome.recipe_edits, attempt_dir)
        if recipe_edit is not None:
            # the rung's own evidence describes the edited recipe; an earlier rung reaches it through the
            # recorded edit chain only if it reads none of the edited keys (`Workspace.changed_files`)
            files_read = {**files_read, recipe_edit["file"]: recipe_edit["sha256_after"]}
    passed = failure is None and gate_passed(criteria)
    entry = replace(entry, criteria=criteria, status=Status.PASSED if passed else Status.FAILED,
                    recipe_edit=recipe_edit, files_read=files_read,
                    error=failure.entry_text() if failure is not None else None)  # fmt: skip
    return entry, failure


def _apply_recipe_edits(run: AttemptInputs, edits: list[RecipeEdit],
                        attempt_dir: Path) -> tuple[dict | None, Failure | None]:  # fmt: skip
    """Write a passed rung's edits into recipe.toml: (the entry's recipe_edit record: the file and its
    hashes before and after, the edits; or None, and the failure where they could not be written)."""
    spec = TABLE.get(run.rung)
    foreign = [e.key for e in edits if spec is not None and not earns_key(spec, e.key)]
    if foreign:  # the table says what a rung may decide; a key outside it is a bug, not a decision
        error = (f"recipe edit refused, recipe.toml unchanged: the {run.rung} rung may write "
                 f"{', '.join(sorted(spec.earns)) or 'no recipe key'}, not {', '.join(foreign)}")  # fmt: skip
        return None, Failure(error, _write_error(run.ws, attempt_dir, f"{error}\n"))
    try:
        record = apply_edits(run.ws.recipe_path, edits)
    except (RecipeEditError, OSError) as e:
        error = f"recipe edit failed, recipe.toml unchanged: {type(e).__name__}: {e}"
        return None, Failure(error, _write_error(run.ws, attempt_dir, f"{error}\n"), os_error=isinstance(e, OSError))
    return {"file": run.ws.key_for(run.ws.recipe_path), **record}, None


def _close(run: AttemptInputs, entry: Entry, failure: Failure | None, message: str) -> StepOutcome:
    """Commit the attempt's whole entry in its placeholder's place (the ledger's one write after the rung)."""
    what = f"{run.rung} attempt {entry.attempt}"
    _record(run.ledger, f"{what} ended {entry.status}" + (f" ({failure.error})" if failure else ""),
            lambda: run.ledger.commit(entry))  # fmt: skip
    os_error = failure.error if failure is not None and failure.os_error else None
    if os_error:
        message = f"{what} failed on an OS error: {entry.error}; recorded in {run.ledger.path}"
    return StepOutcome(
        run.ws.name,
        entry.status,
        run.rung,
        entry.attempt,
        criteria=entry.criteria,
        human=list(run.checklist.human),
        message=message,
        entry=entry,
        os_error=os_error,
    )


# ---- helpers ----------------------------------------------------------------------------------
def environment(device: str) -> dict:
    """Device and library versions recorded with every attempt."""
    env = {"device": device, "python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "transformers", "titan-onboard"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass  # transformers is an optional extra
    return env


def _check_result(result) -> RungResult:
    if not isinstance(result, RungResult):
        raise TypeError(f"rung returned {type(result).__name__}, expected RungResult")
    if not isinstance(result.measurements, Measurements) or not isinstance(result.files_read, list):
        raise TypeError("RungResult.measurements must be the rung's Measurements and files_read a list")
    if not isinstance(result.recipe_edits, list) or not all(isinstance(e, RecipeEdit) for e in result.recipe_edits):
        raise TypeError("RungResult.recipe_edits must be a list of RecipeEdit")
    if result.not_applicable is not None and not str(result.not_applicable).strip():
        raise TypeError("RungResult.not_applicable must say why the rung does not apply")
    return result


def _write_error(ws: "Workspace", attempt_dir: Path, text: str | None = None) -> str | None:
    """Write the attempt's error.txt (default: the traceback being handled); its key, or None where
    the disk refused that too (disk full)."""
    path = attempt_dir / "error.txt"
    try:
        path.write_text(traceback.format_exc() if text is None else text)
    except OSError:
        return None
    return ws.key_for(path)


def _record(ledger: Ledger, what: str, write: Callable[[], None]) -> None:
    """The ledger's write after the rung (`write`: its commit or withdrawal); where the disk refuses, say
    what could not be recorded and what the file still shows (the placeholder reads interrupted), as
    EnvironmentFailed (exit 1)."""
    try:
        write()
    except OSError as e:
        raise EnvironmentFailed(
            f"{what}, but {ledger.path} could not be updated ({describe_os_error(e)[1]}); "
            "it still holds the placeholder written before the rung started, which reads interrupted"
        ) from e


def _remove_attempt_dir(ws: "Workspace", attempt_dir: Path) -> None:
    """Remove a withdrawn attempt's folder, and runs/<rung>/ and runs/ if that leaves them empty."""
    shutil.rmtree(attempt_dir, ignore_errors=True)
    for parent in (attempt_dir.parent, ws.runs_dir):  # runs/<rung>/ and runs/, if this made them
        try:
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        except OSError:
            return  # tidying up never hides the error that made the attempt go
