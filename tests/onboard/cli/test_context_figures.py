"""No unpaired figure carries an outcome (DESIGN section 7): a ratio of two runs timed apart is printed
and recorded as context, with no interval and no faster / slower / indistinguishable; only an
interleaved, paired comparison carries those, and an interval that measured nothing prints
"not measured" wherever it is printed.

The ledger of the report and status checks is the demo's (report_ladder.json, via
test_report_files.demo_ws): an older ledger, which still holds the retired unpaired fields
(vs_eager, vs_eager_text, speedup_vs_eager_ci, fsdp2_vs_simple_fsdp) and a data_parallel_why that
quotes one; its readers must show none of them, and must not fail on them."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.cli.views import ladder_table, status_dict
from onboard.ladder.gates import TIMED_APART, comparison_line, timed_apart
from onboard.ladder.measurements.retired import REPR_COPIES, RETIRED, UNPAIRED, UNPAIRED_QUOTED, shown_measurements
from onboard.ladder.measurements.training_measurements import (
    CompileMeasurements,
    GraphTrainerMeasurements,
    TuningMeasurements,
)
from onboard.ladder.states import ladder_states
from onboard.ladder.table import default_specs
from onboard.report import pictures as rp
from onboard.report.facts import records
from onboard.report.speed_section import factor_cell
from onboard.report.steps import Factor, Step, step_text, waterfall_steps
from onboard.report.write import write_report_files
from onboard.rungs import run_compare
from onboard.workspace.layout import Workspace
from titan_core.measure.timing import Comparison
from test_report_files import demo_ws  # noqa: F401 (the fixture)

ROOT = Path(__file__).parents[3]
INTERVAL = re.compile(r"\d+\.\d+\s*-\s*\d+\.\d+|\bCI\b")
"""An interval as any of onboard's writers prints one ("1.14-1.31", "99% CI ...")."""
OUTCOME = re.compile(r"\b(faster|slower|indistinguishable)\b")


def is_context(text: str) -> bool:
    """Labelled context, with no interval and no outcome word."""
    return TIMED_APART in text and not INTERVAL.search(text) and not OUTCOME.search(text)


# ---- what the rungs record and say ---------------------------------------------------------------
@pytest.mark.parametrize("kind", [CompileMeasurements, GraphTrainerMeasurements, TuningMeasurements])
def test_a_run_beside_eager_is_context_with_no_interval_and_no_outcome(kind):
    """compile, graph_trainer and tuning put their run beside eager's through run_compare.beside_eager;
    the line each rung logs ends with vs_eager_context (compile_rung, graph_trainer_rung)."""
    m = kind()
    m.update(step_time_median_s=0.041, peak_mem_bytes=300, step_times_s=[0.040, 0.041, 0.045])
    evidence = {"eager": {"step_time_median_s": 0.063, "step_times_s": [0.06, 0.063, 0.07], "peak_mem_bytes": 200}}
    m = kind.from_parts(m, run_compare.beside_eager(m, evidence))  # the rung's record: its run beside eager's
    assert m.vs_eager_context == "context (timed apart, no interval): median step 41 ms against eager's 63 ms, 1.54x"
    assert is_context(m.vs_eager_context)
    assert m.speedup_vs_eager == pytest.approx(0.063 / 0.041) and m.peak_mem_vs_eager == 1.5
    assert not RETIRED & set(m.as_metrics())  # the unpaired interval and outcome are gone
    assert not RETIRED & set(kind.declared())


def test_without_eager_step_times_the_context_says_what_is_missing():
    m = CompileMeasurements()
    m.update(step_time_median_s=0.041, peak_mem_bytes=300)
    m = CompileMeasurements.from_parts(m, run_compare.beside_eager(m, {"eager": {}}))
    assert m.vs_eager_context == "context (timed apart, no interval): no ratio (eager recorded no step time)"
    assert "speedup_vs_eager" not in m
    assert timed_apart(None, 0.2, "SimpleFSDP", "FSDP2").endswith("no ratio (FSDP2 recorded no step time)")
    assert timed_apart(0.14, 1.25, "one process", "fsdp2") == (
        "context (timed apart, no interval): fsdp2's median step 140 ms against one process's 1.25 s, 8.93x")


def test_nothing_in_onboard_or_bench_calls_the_unpaired_comparison():
    """Two runs timed apart are never compared with an interval: titan_core has no unpaired comparison
    (compare_samples, Welch's interval, is gone) and nothing in onboard or bench names one."""
    from titan_core.measure import timing

    assert not hasattr(timing, "compare_samples")
    users = []
    for path in [*(ROOT / "onboard").rglob("*.py"), *(ROOT / "bench").glob("*.py")]:
        text = path.read_text()
        if "compare_samples" not in text:  # no name without its text: only a file that holds it is parsed
            continue
        tree = ast.parse(text, str(path))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if "compare_samples" in names:
            users.append(str(path.relative_to(ROOT)))
    assert users == []


# ---- degenerate intervals ----------------------------------------------------------------------
def wide_comparison(outcome: str = "indistinguishable") -> Comparison:
    """A paired comparison whose interval measured nothing (0.00-512246.96: a bf16 timing once printed so)."""
    return Comparison(outcome=outcome, ratio=1.1, ci_low=1e-6, ci_high=512246.96, confidence=0.99, rounds=2,
                      stopped="max_rounds", candidate_median_s=0.11, baseline_median_s=0.1)  # fmt: skip


def test_a_degenerate_interval_prints_not_measured_everywhere_it_is_printed():
    wide = Factor(1.5, 0.01, 40.0, 0.01, "faster", True, "", 2)  # a product of intervals, 4000x apart
    none = Factor(1.5, outcome=None)  # a recorded interval the reader dropped (steps._factor)
    for f in (wide, none):
        assert step_text(f, "kept") == "1.50x interval: not measured"
        assert factor_cell(f) == "1.50x (interval: not measured)"
        assert rp._bar_label(f, cumulative=True) == "1.50x\ninterval:\nnot measured"
    line = comparison_line(wide_comparison(), "kernels.loss=fused_ce", "kernels.loss=plain")
    assert "interval not measured" in line and not INTERVAL.search(line) and not OUTCOME.search(line)
    good = Comparison(outcome="faster", ratio=0.8, ci_low=0.75, ci_high=0.85, confidence=0.99, rounds=8,
                      stopped="interval", candidate_median_s=0.08, baseline_median_s=0.1)  # fmt: skip
    assert comparison_line(good, "a", "b") == good.describe("a", "b")


def test_the_waterfall_does_not_draw_a_whisker_for_an_interval_that_measured_nothing():
    steps = [Step("eager", "eager", "baseline", "", Factor(1.0, 1.0, 1.0, 0.0, None, True, "", 0), "eager", None),
             Step("kernels", "kernels", "kept", "k", Factor(1.5, 0.01, 40.0, 0.01, "faster", True, "", 2), "kernels",
                  None),
             Step("final recipe", "final", "final recipe", "", None, "", None)]  # fmt: skip
    fig = rp.draw_waterfall(steps)
    assert not [c for ax in fig.axes for c in ax.collections if (c.get_gid() or "").endswith("-ci")]
    ax = next(a for a in fig.axes if a.get_gid() == "waterfall-steps")
    assert ax.get_ylim()[1] < 40  # the axis is the bar's, not the 4000x-wide interval's


# ---- readers of an older ledger ----------------------------------------------------------------
def older(ws: Workspace) -> Workspace:
    """The demo workspace with graph_trainer's interleaved execution-mode record gone: compile's and
    graph_trainer's waterfall steps fall back to their runs timed apart (context)."""
    path = ws.root / "ladder.json"
    data = json.loads(path.read_text())
    gt = next(e for e in reversed(data["attempts"]) if e["rung"] == "graph_trainer")
    del gt["details"]["execution_mode"]
    path.write_text(json.dumps(data, indent=1))
    return Workspace.load(ws.root.parent.parent, ws.name)


def test_the_report_prints_no_interval_or_outcome_for_a_context_figure(demo_ws):  # noqa: F811
    ws = older(demo_ws)
    data = json.loads((ws.root / "ladder.json").read_text())
    held = {k for e in data["attempts"] for k in e.get("measurements") or {}}
    assert UNPAIRED <= held  # the fixture is an older ledger: it holds every retired unpaired field
    assert held & REPR_COPIES  # and floats repeated as their repr strings
    files = write_report_files(ws)  # and reading it does not fail
    report = files.markdown.read_text()
    assert "unpaired" not in report and "vs_eager_text" not in report and "| vs_eager |" not in report
    assert not any(f"| {name} |" in report for name in REPR_COPIES)  # a float's repr copy is not shown
    assert "| vs_eager_context |" not in report  # an older ledger has none: nothing is made up
    assert f"| data_parallel_why | {UNPAIRED_QUOTED} |" in report
    summary = report.split("## Summary", 1)[1].split("\n## ", 1)[0]
    for row in ("| step time |", "| tokens/s |"):
        line = next(x for x in summary.splitlines() if x.startswith(row))
        cell = line.split(" | ")[-1]
        assert is_context(cell) and "not a decision" in cell, line
    steps = waterfall_steps(records(ladder_states(ws, default_specs())))
    apart = [s for s in steps if s.factor is not None and not s.factor.protocol]
    assert {s.rung for s in apart} >= {"compile", "graph_trainer"}
    for s in apart:
        for text in (s.text, factor_cell(s.factor, s.kind), rp._bar_label(s.factor, cumulative=False)):
            assert not INTERVAL.search(text) and not OUTCOME.search(text), text
            assert "context" in text and "no interval" in text, text
        assert f"| {factor_cell(s.factor, s.kind)} |" in report
    assert json.dumps(files.summary["waterfall"]).count('"outcome": null') >= len(apart)


def test_status_prints_no_context_figure_and_no_unpaired_interval(demo_ws):  # noqa: F811
    ws = older(demo_ws)
    states = ladder_states(ws, default_specs())
    console = Console(width=400, record=True)
    console.print(ladder_table(states))
    text = console.export_text()
    assert "unpaired" not in text and not INTERVAL.search(text) and not OUTCOME.search(text), text
    shown = json.dumps(status_dict(ws, states))
    assert "unpaired" not in shown and not RETIRED & set(re.findall(r'"(\w+)":', shown))
    out = CliRunner().invoke(app, ["status", ws.name, "--dir", str(ws.root.parent.parent), "--json"])
    assert out.exit_code == 0, out.output
    assert "unpaired" not in out.output and "speedup_vs_eager" not in out.output


def test_shown_measurements_leave_out_the_retired_fields_and_quoted_unpaired_lines():
    m = {"vs_eager": {"outcome": "faster", "paired": False}, "vs_eager_text": "x", "speedup_vs_eager_ci": "1.2x",
         "fsdp2_vs_simple_fsdp": "FSDP2 is 1.4x faster (99% CI 1.3-1.5x, 8 rounds, unpaired)",
         "data_parallel_why": "SimpleFSDP stays (FSDP2 measured beside it: FSDP2 is 1.4x faster (..., unpaired))",
         "speedup_vs_eager": 1.2, "vs_eager_context": timed_apart(0.1, 0.12, "eager")}  # fmt: skip
    assert shown_measurements(m) == {"data_parallel_why": UNPAIRED_QUOTED, "speedup_vs_eager": 1.2,
                                     "vs_eager_context": m["vs_eager_context"]}  # fmt: skip
