"""The contract between the ladder engine and every rung.

A rung module `onboard/rungs/<rung>.py` exposes `RUNG = "<rung>"` and
`run(ctx: RungContext) -> RungResult`. It does the work and measures; it never decides
pass or fail (the engine evaluates `checklists/<rung>.yaml` against the measurements) and
never writes ladder.json. Bad user input raises `onboard.errors.BadInput` (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from onboard.workspace import Workspace


@dataclass
class RungContext:
    workspace: "Workspace"
    """The workspace: .root, .name, .recipe_path, .hf_config_path, .weights_dir, .family, .path_kind, .device."""
    attempt_dir: Path
    """runs/<rung>/attempt-<N>/, created by the engine: logs, metrics.jsonl, results.json go here."""
    evidence: dict
    """Measurements of the passed earlier rungs, {rung: measurements}, e.g. evidence["eager"]["step1_loss"]."""
    log: Callable[[str], None]
    """Prints a progress line to the person waiting (stderr; silent under --json)."""


@dataclass
class RungResult:
    measurements: dict[str, Any]
    """Flat metric name -> JSON-serialisable value; exact floats also as repr strings (e.g. step1_loss_repr)."""
    files_read: list[Path]
    """Files whose hashes make this rung stale when they change (workspace-relative or absolute)."""
    command: str
    """The shell command that reproduces the work."""
    not_applicable: str | None = None
    """Why the rung does not apply to this model (never "skipped"); the gate is then not evaluated."""
    details: dict[str, Any] = field(default_factory=dict)
    """Extra structured facts for the report (loss curve, parity table, first divergent module, device)."""
