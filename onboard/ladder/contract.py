"""The contract between the ladder engine and every rung.

A rung module `onboard/rungs/<rung>_rung.py` exposes `RUNG = "<rung>"` and
`run(ctx: RungContext) -> RungResult`. It does the work and measures; it never decides
pass or fail (the engine evaluates `checklists/<rung>.yaml` against the measurements) and
never writes ladder.json. Bad user input raises `onboard.errors.BadInput` (exit 2).

A rung that earns flags for the recipe never writes recipe.toml itself: it returns them as
`RungResult.recipe_edits`, and the engine applies them only when the gate passed (see
`onboard.ladder.recipe_edit`), recording each with its reason in the ledger entry.

What the ladder knows of a rung without running it is its declaration in the rung table
(onboard/ladder/table.py), never its module, so that `status`, `list` and `report` import no rung:

- `reads_recipe_key(key: str) -> bool` ("section.field"): whether its run depends on that recipe
  key. A recipe edit recorded by a later passed rung leaves this rung's evidence standing only if
  it touched no key this rung reads; without one a rung reads every key (any edit re-verifies it).
- `not_applicable(ws, recipe: dict) -> str | None` (the reason, or None: it applies), cheap and
  free of model building; the rung's `run` returns `RungResult(not_applicable=<the same rule>)`:
  `onboard status` recomputes the rule to check a not_applicable entry of ladder.json, and the
  engine records not_applicable only where the rule agrees. Without one a rung applies to every model.
- `evidence_problem(ws, entry) -> str | None`: why a passed entry no longer stands for this
  workspace beyond its measurements (parity: test_parity.py is no longer the template's).
- `earns`: the recipe keys a passed gate of it may write.

A module-like fake passed to a `RungSpec` without a module name (tests) declares itself: its own
`reads_recipe_key`, `not_applicable` and `evidence_problem` attributes, where it has them.

Each rung declares what it measures as a `Measurements` dataclass (one field per metric, its
meaning and unit in the field's docstring; onboard/ladder/measurements/) and returns one in
`RungResult.measurements`. The
checklists may judge only declared fields (tests/onboard/unit/test_measurement_declarations.py),
and a rung that sets an undeclared name fails where it sets it, so a renamed metric is found by
the fast tests, not when its rung first runs. The ledger stores `as_metrics()`: the flat
{metric: value} object ladder.json has always held.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace


SHIPPED = "shipped"
"""The timing profile of a ladder as it is meant to run: the checklists' own `params.timing`."""


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
    timing_profile: str = SHIPPED
    """The timing profile this attempt's keep/choose decisions are timed with (onboard/rungs/timing_profiles.py):
    SHIPPED, the checklists' own protocol, unless `next-step` was given another (compat, tests: "quick")."""
    runs: list[dict] = field(default_factory=list)
    """Every gated training run of the attempt, as `gated_runs.record_run` saw it: {run, steps_planned,
    steps_run, problem}. The engine turns them into `runs_whole` (gated_runs.runs_verdict)."""


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


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""The default of every measurement: not taken this attempt, so `as_metrics` leaves it out (as the
ledger always has). None is a value: a measured "none" (no host sync found, no eager interval)."""


def flattened() -> Any:
    """A dict field whose items are measurements under names made at run time (one per kernel
    flag, per memory policy, per declared parity feature): `as_metrics` puts them beside the
    declared ones. A checklist never judges them: only a declared field has a name to rename."""
    return field(default_factory=dict, metadata={"flattened": True})


@dataclass(kw_only=True)
class Measurements(Mapping[str, Any]):
    """Base of each rung's declared measurements; subclasses add one field per metric, default ABSENT.

    Setting an undeclared name raises (on construction, `update` or attribute assignment), so a
    misspelt metric fails in the rung that writes it. Reads go like the flat dict the ledger
    stores (`m["graph_breaks"]`, `m.get(...)`), for code and tests written against that dict.
    """

    @classmethod
    def declared(cls) -> frozenset[str]:
        """The metric names a checklist may judge: every field but the flattened ones."""
        return frozenset(f.name for f in fields(cls) if not f.metadata.get("flattened"))

    def as_metrics(self) -> dict[str, Any]:
        """{metric: value} as the ledger stores it: the fields measured, then the flattened ones' items."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("flattened"):
                out.update(value)
            elif value is not ABSENT:
                out[f.name] = value
        return out

    def update(self, values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        """Set measurements by name (a helper's dict of them, or keywords); an undeclared name raises."""
        for name, value in {**(values or {}), **more}.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.__dataclass_fields__:
            raise TypeError(f"{type(self).__name__} declares no measurement {name!r}")
        object.__setattr__(self, name, value)

    def __getitem__(self, name: str) -> Any:
        return self.as_metrics()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_metrics())

    def __len__(self) -> int:
        return len(self.as_metrics())


@dataclass
class RungResult:
    measurements: Measurements
    """The rung's declared measurements (its Measurements subclass); exact floats also as repr strings
    (e.g. step1_loss_repr). The engine evaluates the checklist on, and records, `as_metrics()`."""
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
