"""Attempt folders as the engine writes them, for fixtures holding a ladder recorded elsewhere (the
demo's report_ladder.json, tuning_entry.json): each gated run's metrics.jsonl, written the way
titan_core writes it (encode_row) with the rows the entry's measurements were taken from, recorded
through the engine's own path (contract.record_run, run_metrics.seal_runs), and the attempt record
(run_metrics.attempt_record) beside them. So every reader's re-check of the files a pass rests on
(onboard/ladder/measurements/run_metrics.py) holds, as it does for a ladder the engine climbed."""

from __future__ import annotations

from typing import Any

from onboard.ladder.contract import METRICS_FILE, RungContext, record_run
from onboard.ladder.measurements.run_metrics import DERIVED, attempt_record_text, seal_runs, shown_runs
from onboard.ladder.table import TABLE
from onboard.workspace.ledger import RUN_RECORD, Entry
from titan_core.measure.metrics import encode_row


def _value(m: dict, fields: dict[str, str], kinds: tuple[str, ...], default: Any) -> Any:
    """The first measurement whose kind (run_metrics._FROM_ROWS) is one of `kinds`, as a number."""
    for name, kind in fields.items():
        if kind in kinds and name in m and m[name] is not None:
            return m[name] if kind in ("steps_run", "steps_planned") else float(m[name])
    return default


def planned_runs(entry: dict) -> list[tuple[str, list[dict], int]]:
    """(label, rows, planned) of each gated run the entry's measurements count (runs_recorded): the
    runs its rung takes measurements from (run_metrics.DERIVED) with rows that give those values,
    then whole runs of 3 steps for the rest."""
    m, rung = entry.get("measurements") or {}, entry["rung"]
    if "runs_recorded" not in m:
        return []
    out = []
    for label, fields in DERIVED.get(TABLE[rung].measurements if rung in TABLE else None, ()):
        steps = _value(m, fields, ("steps_run",), 3)
        planned = _value(m, fields, ("steps_planned",), steps)
        first = _value(m, fields, ("step1_loss",), 2.0)
        last = _value(m, fields, ("last_loss",), first * 0.9 if steps > 1 else first)
        norm = _value(m, fields, ("step1_grad_norm",), 1.0)
        losses = [first + (last - first) * i / max(steps - 1, 1) for i in range(steps)]
        losses[-1] = last  # exactly the recorded last loss, whatever the interpolation rounded to
        out.append((label, [{"step": i, "loss": x, "grad_norm": norm if i == 1 else 0.5}
                            for i, x in enumerate(losses, 1)], planned))  # fmt: skip
    for k in range(len(out), m["runs_recorded"]):
        rows = [{"step": i, "loss": 2.0 - i / 10, "grad_norm": 1.0} for i in (1, 2, 3)]
        out.append((f"{rung}: run {k + 1}", rows, 3))
    return out


def write_attempt_folder(ws, entry: dict) -> dict:
    """Write `entry`'s attempt folder (metrics files and record) into `ws`; returns the entry with the
    details.gated_runs the engine would have given it (its ledger copy is the caller's to save)."""
    folder = ws.root / entry["attempt_dir"]
    folder.mkdir(parents=True, exist_ok=True)
    ctx = RungContext(workspace=ws, attempt_dir=folder, evidence={}, log=lambda line: None)
    for i, (label, rows, planned) in enumerate(planned_runs(entry)):
        path = folder / f"run-{i}" / METRICS_FILE
        path.parent.mkdir()
        path.write_text("".join(encode_row(r) + "\n" for r in rows))
        record_run(ctx, label, rows, planned, path)
    sealed = seal_runs(ws, ctx.runs, folder)
    (folder / RUN_RECORD).write_text(attempt_record_text(Entry.from_dict(entry), sealed))
    if sealed:
        entry = {**entry, "details": {**(entry.get("details") or {}), "gated_runs": shown_runs(sealed)}}
    return entry
