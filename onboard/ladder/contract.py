"""The contract between the ladder engine and every rung (DESIGN section 4).

A rung module (`onboard/rungs/<rung>_rung.py`, or `<rung>_rung/rung.py` for a rung with parts of its own)
exposes `RUNG = "<rung>"` and `run(ctx: RungContext) ->
RungResult`: it does the work and returns its declared `Measurements` and the `RecipeEdit`s it earned. The
record is built once, at the end of `run`, by its constructor (`from_parts`: the parts its helpers measured,
each a record of the same type, and the rest by keyword), so a misspelt or undeclared name fails where it is
written; the engine serialises it once (`as_metrics`) into ladder.json and the attempt folder's record.
It never decides pass or fail (the engine evaluates `checklists/<rung>.yaml`) and never writes ladder.json
or recipe.toml (the engine applies the edits only when the gate passed, onboard.ladder.recipe_edit). Bad
user input raises `onboard.errors.BadInput` (exit 2). What the ladder knows of a rung without running it
is its declaration in the rung table (onboard/ladder/table.py), never its module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Self

from titan_core.measure.metrics import read_metrics
from titan_core.measure.run_stats import not_whole

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
    """Every gated training run of the attempt, as `record_run` saw it: {run, steps_planned,
    steps_run, problem, metrics_file, losses, grad_norms}. The engine turns them into `runs_whole`
    (`settle_runs`) and keeps them in the attempt folder's record, where every reader re-reads each
    metrics file against them (onboard/ladder/measurements/run_metrics.py)."""


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
    """Base of each rung's declared measurements (onboard/ladder/measurements/): one field per metric,
    its meaning and unit in its docstring, default ABSENT; a checklist may judge only these.

    A rung builds its record once, by keyword (`from_parts`), so a misspelt or undeclared name fails at
    construction (and under a type checker); setting an undeclared name by `update` or attribute
    assignment raises too. Reads go like the flat dict the ledger stores (`m["graph_breaks"]`,
    `m.get(...)`), for code and tests written against that dict.
    """

    @classmethod
    def from_parts(cls, *parts: "Measurements", **values: Any) -> Self:
        """The record of `parts` (what a rung's helpers measured, each built by its own constructor as a
        record of this type or one of its bases, so its names are this type's fields) and `values` (the
        rest, by keyword). A field measured twice raises: each measurement comes from one place."""
        merged: dict[str, Any] = {}
        for part in parts:
            if not isinstance(part, Measurements) or not issubclass(cls, type(part)):
                raise TypeError(f"{cls.__name__} is not made of a {type(part).__name__}: a part is a record of "
                                "it or of a base")  # fmt: skip
            for f in fields(part):
                value = getattr(part, f.name)
                if value is ABSENT or (f.metadata.get("flattened") and not value):
                    continue  # not measured by this part
                if f.name in merged:
                    raise TypeError(f"{cls.__name__}: {f.name} measured by two parts")
                merged[f.name] = value
        if twice := sorted(merged.keys() & values.keys()):
            raise TypeError(f"{cls.__name__}: {', '.join(twice)} measured by a part and given again")
        return cls(**merged, **values)

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
        """Set measurements by name; an undeclared name raises. For tests and by-hand records: a rung
        builds its record once (`from_parts`) instead of filling one by names."""
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
    """The record the rung's run built (its Measurements subclass, the rung table's `measurements`); floats as
    they are (the ledger's JSON keeps each one exactly). The engine serialises it once, `as_metrics()`, and
    evaluates the checklist on and records that."""
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


# ---- the gated runs of a training rung ----------------------------------------------------------
@dataclass(kw_only=True)
class GatedRuns(Measurements):
    """What every rung that trains records of its runs: their precision, and that each ran whole.

    "Passed" means the recipe ran as planned: a gate whose run stopped at step 2 of 20, or logged a NaN
    grad norm with a finite loss, proves nothing about the steps it did not run. So each gated run is
    recorded on the attempt's `RungContext.runs` (`record_run`; `train_run.train` does it for every
    in-process run) and the engine sets `runs_whole` from them (`settle_runs`), which every training
    rung's checklist requires."""

    precision: str = ABSENT
    """fp32 | bf16: the precision the rung's runs of the recipe computed in (`gate_recipe.precision`); it picks the
    bound of each criterion that compares two runs (the checklist's threshold per precision)."""
    runs_whole: bool = ABSENT
    """Every gated run of the attempt ran all its planned steps with a finite loss and grad norm at
    every step (set by the engine from `record_run`; absent: the rung recorded no run)."""
    runs_recorded: int = ABSENT
    """Gated runs the attempt recorded (count)."""
    runs_not_whole: list[str] = ABSENT
    """Each run that was not whole: "<run>: <the step and the quantity, or where it stopped>"."""


METRICS_FILE = "metrics.jsonl"
"""The file a titan_core run writes its rows into (titan_core.measure.metrics), one per output folder."""


def _signature(rows: list[dict]) -> list[tuple] | None:
    """(step, loss, grad norm) of each row, the floats as their repr ("7.6123", "nan": exact, and strict
    JSON even when not finite); None for rows that are not a run's."""
    try:
        return [(r.get("step", i), *(repr(float(r[k])) for k in ("loss", "grad_norm"))) for i, r in enumerate(rows, 1)]
    except (KeyError, TypeError, ValueError):
        return None


def find_metrics_file(attempt_dir: Path, rows: list[dict], claimed: set[str] = frozenset()) -> Path | None:
    """The metrics.jsonl under the attempt folder whose rows are exactly `rows` (every step's loss and
    grad norm, bit for bit): the file the run wrote, found without the rung naming it. One no earlier
    run claimed comes first (two runs may log the same rows); None when no file holds them."""
    want = _signature(rows)
    if not rows or want is None or not Path(attempt_dir).is_dir():
        return None
    found = []
    for path in sorted(Path(attempt_dir).rglob(METRICS_FILE)):
        try:
            if _signature(read_metrics(path)) == want:
                found.append(path)
        except (OSError, ValueError):
            continue  # a file this run did not write (half-written, not rows): not its record
    return next((p for p in found if str(p) not in claimed), found[0] if found else None)


def record_run(ctx: RungContext, label: str, rows: list[dict], planned: int,
               metrics_file: Path | None = None) -> str | None:  # fmt: skip
    """Record one gated run on `ctx.runs`; returns why it is not whole (None: every planned step ran,
    its loss and grad norm finite). A gate passes only when every run it recorded is whole.

    The run's metrics file (`metrics_file`, else the one under the attempt folder that holds exactly
    these rows) and its loss and grad-norm curves are kept with it, so a reader can re-read the file
    and find an edit, a cut or a deletion (DESIGN section 4)."""
    problem = not_whole(rows, planned)
    if metrics_file is None:
        metrics_file = find_metrics_file(ctx.attempt_dir, rows, {r.get("metrics_file") for r in ctx.runs})
    signature = _signature(rows)
    ctx.runs.append({
        "run": label, "steps_planned": planned, "steps_run": len(rows), "problem": problem,
        "metrics_file": str(metrics_file) if metrics_file is not None else None,
        "losses": [s[1] for s in signature] if signature else [],
        "grad_norms": [s[2] for s in signature] if signature else [],
    })  # fmt: skip
    if problem:
        ctx.log(f"{label}: not whole: {problem}")
    return problem


def settle_runs(measurements: Measurements, runs: list[dict]) -> None:
    """Set a training rung's `GatedRuns` measurements from the runs it recorded (the engine, after the rung returns)."""
    if runs and isinstance(measurements, GatedRuns):
        broken = [f"{r['run']}: {r['problem']}" for r in runs if r["problem"]]
        # the engine's three fields of the rung's record, before it is serialised (by attribute: declared names)
        measurements.runs_whole, measurements.runs_recorded, measurements.runs_not_whole = not broken, len(runs), broken
