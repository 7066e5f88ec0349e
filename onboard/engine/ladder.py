"""The ladder: rung order, each rung's state from the ledger, and `next-step`.

State of a rung, from its latest attempt in ladder.json:

    pending         never attempted
    passed          latest attempt passed and nothing it read has changed since
    not_applicable  latest attempt said the rung does not apply (with the reason)
    stale           it passed (or was n/a), but a file it read changed, or an earlier rung
                    was re-verified after it: its evidence no longer describes the model
    invalid         the ledger says passed (or n/a), but the entry's recorded measurements
                    do not satisfy its checklist, or it has none (onboard/engine/evidence.py)
    failed          latest attempt failed its gate
    interrupted     latest attempt was stopped (Ctrl-C, SIGTERM, a kill) before it finished
    running         latest attempt is in progress in a live process
    not built yet   DESIGN lists the rung but this version of onboard has no module for it

The current rung is the first built one that is not passed / not_applicable.

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
import os
import platform
import shutil
import signal
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any, Callable

from titan_core.config.loader import ConfigError

from onboard.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PASSED,
    BadInput,
    EnvironmentFailed,
    Interrupted,
    describe_os_error,
)
from onboard.engine.evidence import INVALID, check_entry
from onboard.engine.gates import Checklist, evaluate, gate_passed, load_checklist
from onboard.engine.ledger import Ledger, now_iso, parse_iso
from onboard.workspace.lock import WorkspaceLock, holder
from onboard.engine.recipe_edit import RecipeEditError, apply_edits
from onboard.rungs.contract import RecipeEdit, RungContext, RungResult
from onboard.workspace.layout import Workspace

RUNGS = ("eager", "parity", "simple_fsdp", "compile", "graph_trainer", "kernels", "tuning")
ACCEPTED = ("passed", "not_applicable")
NOT_BUILT = "not built yet"


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
    status: str
    attempts: int
    latest: dict | None
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
        reason, verdict = None, None
        if not spec.built:
            status = NOT_BUILT
        elif latest is None:
            status = "pending"
        elif latest["status"] in ACCEPTED:
            verdict = check_entry(latest, spec.load_checklist, ws.ledger)  # the ledger is evidence, not a claim
            status, reason = latest["status"], latest.get("not_applicable_reason")
            if verdict.problem:
                status, reason = INVALID, verdict.problem
            elif changed := ws.changed_files(latest.get("files_read") or {}, spec.reads_recipe_key()):
                status, reason = "stale", f"changed since it {latest['status']}: {', '.join(changed)}"
            elif newer := [r for r, ended in upstream if ended > parse_iso(latest["started"])]:
                status, reason = "stale", f"{', '.join(newer)} re-verified after this rung {latest['status']}"
        else:
            status = latest["status"]
            reason = latest.get("error")
            if latest.get("ended") is None and latest.get("pid") and latest.get("pid") == running_pid:
                status, reason = "running", f"in progress in pid {running_pid}"
        if verdict is not None and verdict.problem is None and latest.get("ended"):
            upstream.append((spec.name, parse_iso(latest["ended"])))
        states.append(RungState(spec.name, status, len(entries), latest, reason, verdict.criteria if verdict else None))
    return states


def current_state(states: list[RungState]) -> RungState | None:
    """The rung next-step runs: the first built rung that is not passed / not_applicable."""
    return next((s for s in states if s.status not in ACCEPTED and s.status != NOT_BUILT), None)


def last_built(states: list[RungState]) -> str | None:
    built = [s.rung for s in states if s.status != NOT_BUILT]
    return built[-1] if built else None


def environment(device: str) -> dict:
    """Device and library versions recorded with every attempt."""
    env = {"device": device, "python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "transformers", "titan-onboard"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass  # transformers is an optional extra
    return env


@contextmanager
def sigterm_raises():
    """While inside, SIGTERM raises Interrupted in the main thread (like Ctrl-C does)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def entry_error(entry: dict | None) -> str | None:
    """The error an attempt hit, as one line: the engine's (the rung raised) or the one the
    rung reported in its details (parity: the port raised, {kind, message}); None if neither."""
    entry = entry or {}
    if entry.get("error"):
        return str(entry["error"])
    err = (entry.get("details") or {}).get("error")
    if isinstance(err, dict) and err.get("message"):
        return f"{err.get('kind', 'rung')} error: {err['message']}"
    return str(err) if err else None


@dataclass
class StepOutcome:
    """What next-step did; `exit_code` follows DESIGN section 4 (130 for interrupted)."""

    workspace: str
    status: str
    """passed | failed | not_applicable | interrupted | complete"""
    rung: str | None = None
    attempt: int | None = None
    criteria: list[dict] = field(default_factory=list)
    human: list[str] = field(default_factory=list)
    message: str = ""
    entry: dict | None = None
    next_rung: str | None = None
    os_error: str | None = None
    """The OS error the attempt stopped on (disk full, a file it could not read): the
    attempt is recorded failed, and the CLI says this in one line instead of the criteria."""

    @property
    def exit_code(self) -> int:
        return {
            "passed": EXIT_PASSED,
            "not_applicable": EXIT_PASSED,
            "complete": EXIT_PASSED,
            "failed": EXIT_FAILED,
            "interrupted": EXIT_INTERRUPTED,
        }.get(self.status, EXIT_BAD_INPUT)

    def to_json(self) -> dict:
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
            "measurements": (self.entry or {}).get("measurements", {}),
            "details": (self.entry or {}).get("details", {}),
            "error": entry_error(self.entry),
            "attempt_dir": (self.entry or {}).get("attempt_dir"),
            "next_rung": self.next_rung,
            "human_checks": self.human,
            "recipe_edit": (self.entry or {}).get("recipe_edit"),
            "os_error": self.os_error,
            "exit_code": self.exit_code,
        }


def _check_result(result: Any) -> RungResult:
    if not isinstance(result, RungResult):
        raise TypeError(f"rung returned {type(result).__name__}, expected RungResult")
    if not isinstance(result.measurements, dict) or not isinstance(result.files_read, list):
        raise TypeError("RungResult.measurements must be a dict and files_read a list")
    if not isinstance(result.recipe_edits, list) or not all(isinstance(e, RecipeEdit) for e in result.recipe_edits):
        raise TypeError("RungResult.recipe_edits must be a list of RecipeEdit")
    if result.not_applicable is not None and not str(result.not_applicable).strip():
        raise TypeError("RungResult.not_applicable must say why the rung does not apply")
    return result


def _apply_recipe_edits(ws: Workspace, entry: dict, edits: list[RecipeEdit]) -> None:
    """Write a passed rung's edits into recipe.toml and record them (hashes before and after) in its entry.

    files_read gets the recipe's hash after the edit: the rung's own evidence describes the
    edited recipe; an earlier rung reaches it through the recorded edit chain only if it
    reads none of the edited keys (`Workspace.changed_files`), else it re-verifies.
    """
    record = apply_edits(ws.recipe_path, edits)
    key = ws.key_for(ws.recipe_path)
    entry["recipe_edit"] = {"file": key, **record}
    entry["files_read"][key] = record["sha256_after"]


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
    base_command = base_command or f"onboard next-step {ws.name}"
    with WorkspaceLock(ws.root) as lock:
        if lock.took_over:
            log(f"took over the lock left by pid {lock.took_over.get('pid')} (no longer running)")
        ledger = ws.ledger = Ledger.load(ws.ledger.path)  # re-read under the lock
        states = ladder_states(ws, specs)
        current = current_state(states)
        if current is None:
            last = last_built(states)
            not_built = [s.rung for s in states if s.status == NOT_BUILT]
            msg = (
                f"ladder complete up to the last rung that exists: {last}"
                if not_built
                else "ladder complete: every rung passed or does not apply"
            )
            return StepOutcome(ws.name, "complete", message=msg)
        spec = next(s for s in specs if s.name == current.rung)
        return _run_attempt(ws, ledger, specs, spec, current, states, log, base_command)


def _run_attempt(ws, ledger, specs, spec, current, states, log, base_command) -> StepOutcome:
    rung = spec.name
    checklist = spec.load_checklist()
    module = spec.load_module()
    attempt = ledger.next_attempt(rung)
    attempt_dir = ws.runs_dir / rung / f"attempt-{attempt}"
    if attempt_dir.exists():
        shutil.rmtree(attempt_dir)  # left by an attempt that was withdrawn as bad input
    attempt_dir.mkdir(parents=True)
    why = f" (re-verifying: {current.reason})" if current.status in ("stale", INVALID) else ""
    log(f"{rung}: attempt {attempt}{why}")
    evidence = {
        s.rung: s.latest["measurements"] for s in states if s.status == "passed" and s.rung != rung and s.latest
    }
    entry: dict[str, Any] = {
        "rung": rung,
        "attempt": attempt,
        "status": "interrupted",  # until the rung returns: a hard kill leaves this
        "started": now_iso(),
        "ended": None,
        "pid": os.getpid(),
        "command": base_command,
        "attempt_dir": ws.key_for(attempt_dir),
        "environment": environment(ws.device),
        "model": ws.model_label(),  # the twin or the full model: every rung says which it ran
        "rerun_reason": current.reason if current.status in ("stale", INVALID) else None,
        "files_read": {},
        "measurements": {},
        "criteria": [],
        "details": {},
    }
    ledger.append(entry)
    try:
        ledger.save()
    except OSError:
        # nothing could be recorded, so nothing ran: the CLI says why (a read-only
        # workspace is the input's fault, a full disk the machine's)
        ledger.remove(rung, attempt)
        _remove_attempt_dir(ws, attempt_dir)
        raise
    ctx = RungContext(workspace=ws, attempt_dir=attempt_dir, evidence=evidence, log=log)
    error = os_error = traceback_key = None
    try:
        with sigterm_raises():
            result = _check_result(module.run(ctx))
    except (BadInput, ConfigError) as e:
        # the recipe (or a file it names) is bad input, whichever rung found it: exit 2, nothing recorded
        ledger.remove(rung, attempt)
        _record(ledger, f"{rung} attempt {attempt} was withdrawn as bad input ({e})")
        _remove_attempt_dir(ws, attempt_dir)
        if isinstance(e, ConfigError):
            raise BadInput(f"{ws.recipe_path}: {e}") from None
        raise
    except (KeyboardInterrupt, Interrupted) as e:
        entry.update(ended=now_iso(), error=f"interrupted ({type(e).__name__}{': ' + str(e) if str(e) else ''})")
        ledger.replace(entry)
        _record(ledger, f"{rung} attempt {attempt} was interrupted")
        return StepOutcome(
            ws.name, "interrupted", rung, attempt, message=f"{rung} attempt {attempt} interrupted", entry=entry
        )
    except OSError as e:
        # the disk filled up, a file could not be read or written: the attempt could not finish,
        # which is failed (interrupted means a signal), and the CLI says so in one line
        error = os_error = f"{type(e).__name__}: {e}"
        traceback_key = _write_error(ws, attempt_dir, traceback.format_exc())
        result = None
    except Exception as e:  # the model crashed: that is a failed gate the porter must fix, not a warning
        error = f"{type(e).__name__}: {e}"
        traceback_key = _write_error(ws, attempt_dir, traceback.format_exc())
        result = None
    entry["ended"] = now_iso()
    entry["duration_s"] = round((parse_iso(entry["ended"]) - parse_iso(entry["started"])).total_seconds(), 3)
    if result is not None:
        try:
            files_read = ws.hashes(result.files_read)
        except OSError as e:
            error = os_error = f"the files the rung read cannot be fingerprinted: {type(e).__name__}: {e}"
            traceback_key = _write_error(ws, attempt_dir, traceback.format_exc())
            result = None
    if result is not None:
        entry["command"] = result.command or base_command
        entry["files_read"] = files_read
        entry["measurements"] = result.measurements
        entry["details"] = result.details
        entry["environment"]["device"] = str(result.details.get("device", ws.device))
    if result is not None and result.not_applicable:
        entry["status"] = "not_applicable"
        entry["not_applicable_reason"] = str(result.not_applicable)
        message = f"{rung} does not apply: {result.not_applicable}"
    else:
        waivers = {c: w for (_, c), w in ledger.waivers(rung).items()}
        entry["criteria"] = evaluate(checklist, entry["measurements"], evidence, waivers)
        ok = error is None and gate_passed(entry["criteria"])
        if ok and result.recipe_edits:
            # only a passed gate edits the recipe; an edit that cannot be applied fails the attempt
            try:
                _apply_recipe_edits(ws, entry, result.recipe_edits)
            except (RecipeEditError, OSError) as e:
                ok, error = False, f"recipe edit failed, recipe.toml unchanged: {type(e).__name__}: {e}"
                os_error = error if isinstance(e, OSError) else None
                traceback_key = _write_error(ws, attempt_dir, f"{error}\n")
        entry["status"] = "passed" if ok else "failed"
        if error:
            written = f"traceback: {traceback_key}" if traceback_key else "no traceback: error.txt could not be written"
            entry["error"] = f"{error} ({written})"
        message = f"{rung} {'passed' if ok else 'failed'} (attempt {attempt})"
    ledger.replace(entry)
    _record(ledger, f"{rung} attempt {attempt} ended {entry['status']}" + (f" ({error})" if error else ""))
    if os_error:
        message = f"{rung} attempt {attempt} failed on an OS error: {entry['error']}; recorded in {ledger.path}"
    after = current_state(ladder_states(ws, specs))
    return StepOutcome(
        ws.name,
        entry["status"],
        rung,
        attempt,
        criteria=entry["criteria"],
        human=list(checklist.human),
        message=message,
        entry=entry,
        next_rung=after.rung if after else None,
        os_error=os_error,
    )


def _write_error(ws: Workspace, attempt_dir, text: str) -> str | None:
    """Write the attempt's error.txt; its key, or None where the disk refused that too (disk full)."""
    path = attempt_dir / "error.txt"
    try:
        path.write_text(text)
    except OSError:
        return None
    return ws.key_for(path)


def _record(ledger: Ledger, what: str) -> None:
    """Save the ledger; where the disk refuses, say what could not be recorded and what the
    file still shows (the placeholder reads interrupted), as EnvironmentFailed (exit 1)."""
    try:
        ledger.save()
    except OSError as e:
        raise EnvironmentFailed(
            f"{what}, but {ledger.path} could not be updated ({describe_os_error(e)[1]}); "
            "it still holds the placeholder written before the rung started, which reads interrupted"
        ) from e


def _remove_attempt_dir(ws: Workspace, attempt_dir) -> None:
    """Remove a withdrawn attempt's folder, and runs/<rung>/ and runs/ if that leaves them empty."""
    shutil.rmtree(attempt_dir, ignore_errors=True)
    for parent in (attempt_dir.parent, ws.runs_dir):  # runs/<rung>/ and runs/, if this made them
        try:
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        except OSError:
            return  # tidying up never hides the error that made the attempt go
