"""The report's loss picture draws a run's validation loss when its metrics file has validation rows.

The rows are written by titan_core's own encoder (the one the trainer's MetricsLogger writes with),
read back by the report through `read_metrics`, and drawn as their own line (gid `val_loss:<rung>`)
at the steps they were measured; a ledger whose runs did not validate draws what it drew before.
"""

from __future__ import annotations

import io
import json
import math

from onboard.report import pictures as rp
from onboard.report.facts import Record, loss_series, val_loss_series
from onboard.report.write import LOSS, write_report_files
from onboard.workspace.layout import Workspace
from titan_core.measure.metrics import encode_row
from test_report_files import demo_ws  # noqa: F401  # the fixture: a workspace holding the demo's ledger

CURVE = [6.3, 6.1, 5.9, 5.6, 5.4, 5.1]
VAL = {2: 6.2, 4: 5.8, 6: math.nan}  # the last one not finite: the file spells it null + val_loss_repr


def write_metrics(path, val: dict[int, float]) -> None:
    rows = []
    for step, loss in enumerate(CURVE, 1):
        row = {"step": step, "loss": loss, "grad_norm": 1.0, "loss_repr": repr(loss), "grad_norm_repr": "1.0"}
        if step in val:
            row.update(val_loss=val[step], val_ppl=math.exp(val[step]), val_tokens=64)
        rows.append(encode_row(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r + "\n" for r in rows))


def eager(metrics_file: str) -> Record:
    return Record("eager", "passed", {"details": {"loss_curve": CURVE, "metrics_file": metrics_file}})


def loss_lines(fig) -> dict[str, list[float]]:
    ax = next(a for a in fig.axes if a.get_gid() == "loss")
    return {line.get_gid(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    return buf.getvalue()


def test_validation_rows_make_a_series_and_a_line_in_the_loss_picture(tmp_path):
    write_metrics(tmp_path / "runs/eager/attempt-1/metrics.jsonl", VAL)
    recs = [eager("runs/eager/attempt-1/metrics.jsonl")]
    (val,) = val_loss_series(recs, tmp_path)
    assert (val.rung, val.run, val.gid) == ("eager", "", "val_loss:eager")
    assert val.steps == [2, 4, 6]
    assert val.values[:2] == [6.2, 5.8] and math.isnan(val.values[2])
    fig = rp.draw_loss(loss_series(recs), [val])
    lines = loss_lines(fig)
    steps, values = lines["val_loss:eager"]
    assert steps == [2, 4, 6] and values[:2] == [6.2, 5.8] and math.isnan(values[2])
    assert lines["loss:eager:loss_curve"][1] == CURVE  # the training curve is unchanged beside it
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_gid() == "val_loss:eager")
    assert line.get_linestyle() == "--" and line.get_marker() == "D"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "eager validation (3 evals)" in legend
    assert 'id="val_loss:eager"' in svg(fig)


def test_other_runs_of_a_rung_and_absolute_files_are_read_too(tmp_path):
    write_metrics(tmp_path / "fp32.jsonl", {3: 6.0})
    rec = Record("simple_fsdp", "stale", {"details": {"loss_curve": CURVE, "runs": {
        "fp32": {"metrics_file": str(tmp_path / "fp32.jsonl")}, "bf16": {"metrics_file": "gone.jsonl"}}}})  # fmt: skip
    (val,) = val_loss_series([rec], tmp_path / "elsewhere")
    assert (val.gid, val.steps, val.values) == ("val_loss:simple_fsdp:fp32", [3], [6.0])
    assert "stale" in val.label


def test_without_validation_rows_nothing_changes(tmp_path):
    write_metrics(tmp_path / "m.jsonl", {})
    (tmp_path / "broken.jsonl").write_text("not json\n")
    broken = Record("compile", "passed", {"details": {"loss_curve": CURVE, "metrics_file": "broken.jsonl"}})
    recs = [eager("m.jsonl"), broken, Record("kernels", "passed", {"details": {"loss_curve": CURVE}})]
    assert val_loss_series(recs, tmp_path) == []
    series = loss_series(recs)
    with_none, before = rp.draw_loss(series, []), rp.draw_loss(series)
    assert loss_lines(with_none) == loss_lines(before)
    assert not any(gid.startswith("val_loss") for gid in loss_lines(before))
    assert "val_loss" not in svg(before)
    assert rp.png_bytes(with_none) == rp.png_bytes(before)


def test_report_lists_the_validation_losses_under_the_loss_picture(demo_ws):  # noqa: F811
    ws = demo_ws
    ladder = ws.root / "ladder.json"
    data = json.loads(ladder.read_text())
    entry = next(e for e in data["attempts"] if e["rung"] == "eager")
    entry["details"]["metrics_file"] = "runs/eager/attempt-1/metrics.jsonl"
    ladder.write_text(json.dumps(data, indent=1))
    write_metrics(ws.root / "runs/eager/attempt-1/metrics.jsonl", {2: 6.2, 4: 5.8})
    files = write_report_files(Workspace.load(ws.root.parent.parent, ws.name))  # the edited ledger
    assert files.picture(LOSS) is not None
    report = files.markdown.read_text()
    pictures = report.split("## Pictures", 1)[1].split("\n## ", 1)[0]
    assert "- eager (`runs/eager/attempt-1/metrics.jsonl`): 2: 6.2000, 4: 5.8000" in pictures
    assert files.summary["validation"] == [{"rung": "eager", "run": "", "file": "runs/eager/attempt-1/metrics.jsonl",
                                            "steps": [2, 4], "val_loss": [6.2, 5.8]}]  # fmt: skip
