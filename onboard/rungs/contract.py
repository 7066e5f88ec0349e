"""The contract between the ladder engine and every rung.

A rung module `onboard/rungs/<rung>.py` exposes `RUNG = "<rung>"` and
`run(ctx: RungContext) -> RungResult`. It does the work and measures; it never decides
pass or fail (the engine evaluates `checklists/<rung>.yaml` against the measurements) and
never writes ladder.json. Bad user input raises `onboard.errors.BadInput` (exit 2).

A rung that earns flags for the recipe never writes recipe.toml itself: it returns them as
`RungResult.recipe_edits`, and the engine applies them only when the gate passed (see
`onboard.engine.recipe_edit`), recording each with its reason in the ledger entry.

A rung module may define `reads_recipe_key(key: str) -> bool` ("section.field"): whether its
run depends on that recipe key. A recipe edit recorded by a later passed rung leaves this
rung's evidence standing only if it touched no key this rung reads; without the function a
rung reads every key (any edit makes it re-verify).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace


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


@dataclass(frozen=True)
class RecipeEdit:
    """One recipe value a rung earned: `key` = `value` in recipe.toml, with the reason as its comment."""

    key: str
    """Dotted "section.field" (e.g. "kernels.loss"); the last part is the field, the rest its [section]."""
    value: Any
    """A TOML-representable value: str, bool, int, float, or a list of those."""
    why: str
    """One line: why the rung chose it (becomes the `# ...` comment after the value)."""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "why": self.why}


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
    recipe_edits: list[RecipeEdit] = field(default_factory=list)
    """Recipe values the rung earned; applied by the engine only if the gate passes (never on a failed
    gate or a not_applicable rung). Empty: the recipe stays as it is."""
