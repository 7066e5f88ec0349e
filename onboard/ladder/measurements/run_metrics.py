"""A passed entry re-derived from the files its pass rests on (DESIGN section 4): the attempt folder's
record and every gated run's metrics.jsonl.

The engine writes the record (ledger.RUN_RECORD, `attempt_record`) when the rung returns: the entry's
rung, attempt, times and measurements, the sha256 of every file the rung read, and every gated run
(`contract.record_run`) with its planned steps, its loss and grad-norm curves, and its metrics file
with that file's sha256 (`seal_runs`). A reader (`record_problem`) then holds them all together:

- the entry's files_read is not empty, and is the one the attempt folder recorded (a folder copied
  from another workspace, or an entry given this workspace's hashes, disagrees);
- each run's metrics file is inside the attempt folder, still there, its sha256 unchanged, and it
  holds every step the run recorded, loss and grad norm bit for bit; each run's "whole" is what its
  own curve says (every planned step, every value finite);
- the measurements' runs_recorded / runs_whole / runs_not_whole are those runs;
- the measurements a rung takes straight from one run's rows (DERIVED: eager's step-1 and last
  loss, its steps) equal that run's rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onboard.ladder.measurements.training_measurements import (
    CompileMeasurements, EagerMeasurements, SimpleFsdpMeasurements, TuningMeasurements,
)  # fmt: skip
from onboard.workspace.ledger import Entry, json_safe, run_record
from titan_core.measure.metrics import read_metrics
from titan_core.measure.run_stats import not_whole

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace

FILES_READ, RUNS = "files_read", "runs"
"""The record's keys beside ledger.run_record's: the file hashes and the gated runs."""

# What a measurement is, from one run's rows (floats) and its planned steps.
_FROM_ROWS = {
    "steps_run": lambda rows, planned: len(rows),
    "steps_planned": lambda rows, planned: planned,
    "whole": lambda rows, planned: not_whole(rows, planned) is None,
    "step1_loss": lambda rows, planned: rows[0]["loss"] if rows else None,
    "step1_grad_norm": lambda rows, planned: rows[0]["grad_norm"] if rows else None,
    "last_loss": lambda rows, planned: rows[-1]["loss"] if rows else None,
}

DERIVED: dict[type, tuple[tuple[str, dict[str, str]], ...]] = {
    EagerMeasurements: (("eager", {
        "steps_run": "steps_run", "steps_planned": "steps_planned", "all_finite": "whole",
        "step1_loss": "step1_loss", "step1_grad_norm": "step1_grad_norm", "last_loss": "last_loss",
    }),),
    CompileMeasurements: (("compile", {"steps_run": "steps_run", "step1_loss": "step1_loss"}),),
    SimpleFsdpMeasurements: (("simple_fsdp: SimpleFSDP fp32", {
        "steps_run": "steps_run", "step1_loss": "step1_loss", "step1_grad_norm": "step1_grad_norm",
    }),),
    TuningMeasurements: (("tuning: the final recipe, run whole", {
        "final_steps_run": "steps_run", "final_run_whole": "whole", "step1_loss": "step1_loss",
    }),),
}  # fmt: skip
"""{rung's Measurements: ((run label, {measurement: what of that run's rows}), ...)}: the measurements a
rung takes straight from one gated run's rows (onboard/rungs/eager_rung.py `measure`, compile_rung.py
`measure_run`, simple_fsdp_rung.py `measure`, tuning_rung/rung.py `summarise`), by the label it records the
run under. A reader re-derives each from that run's metrics file."""


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---- written by the engine ----------------------------------------------------------------------
def seal_runs(ws: "Workspace", runs: list[dict], attempt_dir: Path) -> list[dict]:
    """The attempt's gated runs (`RungContext.runs`) as its record keeps them: each metrics file as a
    workspace key with its sha256, where the file lies in the attempt folder and still holds the run's
    rows; one that does not (written elsewhere, or a later run of the attempt wrote the same folder) is
    kept as None with a note, so no reader holds the run to a file that is not its own."""
    sealed = []
    for r in runs:
        out = {**r, "metrics_file": None, "metrics_sha256": None}
        path = Path(r["metrics_file"]).resolve() if r.get("metrics_file") else None
        if path is not None:
            try:
                inside = path.is_relative_to(Path(attempt_dir).resolve())
                held = inside and _curves(read_metrics(path)) == (r.get("losses"), r.get("grad_norms"))
            except (OSError, ValueError):
                held = False
            if held:
                out.update(metrics_file=ws.key_for(path), metrics_sha256=sha256_of(path))
            else:
                out["metrics_note"] = f"{ws.key_for(path)} is not in the attempt folder holding this run's rows"
        sealed.append(out)
    return sealed


def attempt_record(entry: Entry, runs: list[dict]) -> dict[str, Any]:
    """What the attempt folder's record holds: ledger.run_record(entry), the files it read, its sealed runs."""
    record = {**run_record(entry), FILES_READ: dict(entry.files_read), RUNS: runs}
    return json.loads(json.dumps(json_safe(record), allow_nan=False, sort_keys=True))


def attempt_record_text(entry: Entry, runs: list[dict]) -> str:
    return json.dumps(attempt_record(entry, runs), indent=2, sort_keys=True) + "\n"


def shown_runs(runs: list[dict]) -> list[dict]:
    """The runs as ladder.json's details keep them: the record's, without the curves (the record has them)."""
    return [{k: v for k, v in r.items() if k not in ("losses", "grad_norms")} for r in runs]


# ---- read by every reader -----------------------------------------------------------------------
def _curves(rows: list[dict]) -> tuple[list[str], list[str]]:
    return [repr(float(r["loss"])) for r in rows], [repr(float(r["grad_norm"])) for r in rows]


def _short(digest: Any) -> str:
    return f"{digest[:12]}..." if isinstance(digest, str) else "none"


def record_problem(entry: Entry, record: dict, where: str, ws: "Workspace", measured: type | None) -> str | None:
    """Why `entry` is not what the files its pass rests on say (module docstring); None when they agree.
    `record`: its attempt folder's record (read from `where`); `measured`: the rung's declared
    Measurements type (DERIVED), None for a rung that declares none."""
    return (
        files_read_problem(entry, record, where)
        or _runs_problem(entry, record, where, ws)
        or _derived_problem(entry, record, where, measured)
    )


def files_read_problem(entry: Entry, record: dict, where: str) -> str | None:
    """Why the files the entry rests on are not known, or not this attempt's (module docstring)."""
    if not entry.files_read:
        return "it records no files_read: nothing it rests on is known, so no change to them could make it stale"
    recorded = record.get(FILES_READ)
    if not isinstance(recorded, dict) or not recorded:
        return f"{where} records no files_read: no run of this onboard wrote it"
    edit = entry.recipe_edit or {}
    for key in sorted(set(entry.files_read) | set(recorded)):
        # the record is written before a passed gate edits the recipe: it may hold the hash before the edit
        before = edit.get("sha256_before") if key == edit.get("file") else None
        if recorded.get(key) not in (entry.files_read.get(key), before) or key not in recorded:
            return (f"{where} says its run read {key} with sha256 {_short(recorded.get(key))}, ladder.json says "
                    f"{_short(entry.files_read.get(key))}: the attempt folder is not this entry's own "
                    "(copied from another workspace or attempt)")  # fmt: skip
    return None


def _runs_problem(entry: Entry, record: dict, where: str, ws: "Workspace") -> str | None:
    runs = record.get(RUNS, [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("run"), str) for r in runs):
        return f"{where}: its runs are not the list the engine writes"
    m = entry.measurements
    if "runs_recorded" in m and m["runs_recorded"] != len(runs):
        return f"its measurements count {m['runs_recorded']!r} gated runs, but {where} records {len(runs)}"
    broken = [f"{r['run']}: {r.get('problem')}" for r in runs if r.get("problem")]
    if "runs_whole" in m:
        if not runs:
            return f"its measurements say runs_whole {m['runs_whole']!r}, but {where} records no gated run"
        if m["runs_whole"] is not (not broken):
            said = f"run {broken[0]}" if broken else "every run whole"
            return f"its measurements say runs_whole {m['runs_whole']!r}, but {where} records {said}"
    if "runs_not_whole" in m and m["runs_not_whole"] != broken:
        return f"its measurements' runs_not_whole {m['runs_not_whole']!r} is not what {where} records ({broken!r})"
    folder = (ws.root / f"runs/{entry.rung}/attempt-{entry.attempt}").resolve()
    for r in runs:
        if problem := _run_problem(r, where, ws, folder):
            return problem
    return None


def _rows_of(r: dict) -> list[dict] | None:
    """A recorded run's curves as rows (floats); None when they are not two equal-length lists of numbers."""
    losses, norms = r.get("losses"), r.get("grad_norms")
    if not isinstance(losses, list) or not isinstance(norms, list) or len(losses) != len(norms):
        return None
    try:
        return [{"step": i, "loss": float(a), "grad_norm": float(b)} for i, (a, b) in enumerate(zip(losses, norms), 1)]
    except (TypeError, ValueError):
        return None


def _run_problem(r: dict, where: str, ws: "Workspace", folder: Path) -> str | None:
    """Why one recorded run is not what its own curve and its metrics file say."""
    label, planned = r["run"], r.get("steps_planned")
    rows = _rows_of(r)
    if rows is None or type(planned) is not int:
        return f"{where}: run {label!r} records no loss and grad-norm curve and planned steps to re-read"
    if r.get("steps_run") != len(rows) or r.get("problem") != not_whole(rows, planned):
        said, curve_says = r.get("problem") or "whole", not_whole(rows, planned) or "whole"
        return f"{where}: run {label!r} is recorded {said}, but its own curve says {curve_says}"
    key = r.get("metrics_file")
    if key is None:
        return None  # the run left no file of its own (seal_runs' note): its curve is all there is
    if not isinstance(key, str):
        return f"{where}: run {label!r} names {key!r} as its metrics file, which is not a path"
    path = ws.path_for(key)
    if not path.resolve().is_relative_to(folder):
        return f"{where}: run {label!r} names {key} as its metrics, which lies outside its attempt folder"
    try:
        on_disk = read_metrics(path)
    except FileNotFoundError:
        return f"{key}, the metrics of run {label!r}, is missing"
    except (OSError, ValueError) as e:
        return f"{key}, the metrics of run {label!r}, cannot be read ({e})"
    if problem := _file_vs_run(key, label, on_disk, rows, planned):
        return problem
    if r.get("metrics_sha256") != sha256_of(path):
        return (f"{key}, the metrics of run {label!r}, changed since its run ended (sha256 {_short(sha256_of(path))}, "
                f"recorded {_short(r.get('metrics_sha256'))})")  # fmt: skip
    return None


def _file_vs_run(key: str, label: str, on_disk: list[dict], rows: list[dict], planned: int) -> str | None:
    """The first step where the metrics file and the run's recorded curve part: a step cut, a value edited."""
    if [d.get("step") for d in on_disk] != list(range(1, len(on_disk) + 1)):
        return f"{key} does not hold run {label!r}'s steps 1..{len(on_disk)} in order, once each"
    if len(on_disk) != len(rows):
        return (f"{key} holds {len(on_disk)} steps of run {label!r}, which ran {len(rows)} of its {planned} "
                "planned steps")  # fmt: skip
    for d, rec in zip(on_disk, rows):
        for q, what in (("loss", "loss"), ("grad_norm", "grad norm")):
            value = d.get(q)  # a hand-written row may hold anything here: null, text, nothing
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or repr(float(value)) != repr(rec[q]):
                shown = float(value) if number else value
                return f"{key}: the {what} at step {d['step']} is {shown!r}, the run recorded {rec[q]!r}"
    return None


def _same(recorded: Any, derived: Any) -> bool:
    """A recorded measurement (JSON: "nan" for a non-finite float) equals one re-derived from rows."""
    if isinstance(derived, float) and isinstance(recorded, (int, float, str)) and not isinstance(recorded, bool):
        try:
            value = float(recorded)
        except ValueError:
            return False
        return value == derived or (math.isnan(value) and math.isnan(derived))
    return recorded == derived


def _derived_problem(entry: Entry, record: dict, where: str, measured: type | None) -> str | None:
    """Why a measurement the rung takes from one run's rows (DERIVED) is not what that run's rows give."""
    runs = record.get(RUNS, [])
    for label, fields in DERIVED.get(measured, ()):
        run = next((r for r in reversed(runs) if r["run"] == label), None)
        if run is None:
            return f"{where} records no run {label!r}, which its measurements {', '.join(fields)} come from"
        rows = _rows_of(run)
        source = run.get("metrics_file") or f"{where} (run {label!r})"
        for name, what in fields.items():
            if name in entry.measurements:
                derived = _FROM_ROWS[what](rows, run["steps_planned"])
                if not _same(entry.measurements[name], derived):
                    return f"its measurements say {name} = {entry.measurements[name]!r}, but {source} gives {derived!r}"
    return None
