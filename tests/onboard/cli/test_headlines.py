"""Headlines are the decisions (issue 33): `onboard status` (table and --json) and REPORT.md print, for
a rung that recorded Decisions, `decision.headline` of them and no other speed figure; the report's
summary sets in bold each kept decision's figure and nothing timed apart; the waterfall's bar of such
a rung is its kept decisions' figure.

The ledger is the demo's (report_ladder.json, via test_report_files.demo_ws) with the Decision records
the rungs write now: graph_trainer kept compile over the recipe's eager, simple_fsdp's bf16 params
were indistinguishable from fp32, and kernels in the list shape (one kept, one held). The demo climb
runs the same check on a real workspace (tests/onboard/e2e/headlines.py, from test_demo.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.cli.views import key_numbers, key_numbers_text, status_dict
from onboard.ladder.table import default_specs
from onboard.ladder.states import ladder_states
from onboard.report.facts import records
from onboard.report.speed_section import decision_figure
from onboard.report.steps import decision_factor, waterfall_steps
from onboard.report.write import write_report_files
from onboard.ladder.decision import decide, headline
from onboard.workspace.layout import Workspace
from test_report_files import demo_ws  # noqa: F401 (the fixture)

_spec = importlib.util.spec_from_file_location("headlines", Path(__file__).parents[1] / "e2e" / "headlines.py")
headlines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(headlines)


def comparison(speedup: float, low: float, high: float, outcome: str) -> dict:
    """A Comparison.to_dict() of a candidate `speedup` times as fast as the holder, its interval [low, high]."""
    return {"outcome": outcome, "ratio": 1 / speedup, "ci_low": 1 / high, "ci_high": 1 / low, "confidence": 0.99,
            "rounds": 12, "paired": True, "load_before": 1.0, "load_after": 1.0}  # fmt: skip


def decisions(any_kept: bool = True) -> dict[str, list[dict]]:
    """{rung: its Decision records} as the rungs write them now."""
    mode = "faster" if any_kept else "indistinguishable"
    return {
        "simple_fsdp": [decide("simple_fsdp", "training.mixed_precision_param", holder="float32", candidate="bfloat16",
                               comparison=comparison(1.03, 0.96, 1.1, "indistinguishable")).to_dict()],
        "graph_trainer": [decide("graph_trainer", "execution_mode", holder="eager", candidate="compile",
                                 comparison=comparison(1.22, 1.14, 1.31, mode)).to_dict()],
        "kernels": [
            decide("kernels", "kernels.loss", holder="plain", candidate="fused_ce",
                   comparison=comparison(1.1, 1.05, 1.16, mode)).to_dict(),
            decide("kernels", "kernels.attention", holder="sdpa", candidate="naive",
                   comparison=comparison(0.8, 0.77, 0.83, "slower")).to_dict(),
        ],
    }  # fmt: skip


def with_decisions(ws: Workspace, by_rung: dict[str, list[dict]]) -> Workspace:
    """The workspace with each rung's latest entry holding `by_rung`'s records in details.decisions
    (kernels' per-field dict moves to details.field_choices, as the kernels rung writes it now)."""
    path = ws.root / "ladder.json"
    data = json.loads(path.read_text())
    latest = {e["rung"]: e for e in data["attempts"]}
    for rung, found in by_rung.items():
        details = latest[rung].setdefault("details", {})
        if isinstance(details.get("decisions"), dict):
            details["field_choices"] = details["decisions"]
        details["decisions"] = found
    path.write_text(json.dumps(data, indent=1))
    return Workspace.load(ws.root.parent.parent, ws.name)


def test_status_shows_the_decisions_headline_and_no_other_speed(demo_ws):  # noqa: F811
    by_rung = decisions()
    ws = with_decisions(demo_ws, by_rung)
    states = ladder_states(ws, default_specs())
    shown = {r["rung"]: r for r in status_dict(ws, states)["rungs"]}
    for s in states:
        expected = by_rung.get(s.rung, [])
        assert shown[s.rung]["decisions"] == expected
        assert shown[s.rung]["headline"] == (headline(expected) if expected else None)
        text = key_numbers_text(s.rung, s.latest)
        assert (headline(expected) in text) if expected else "x (" not in text, (s.rung, text)
        assert not {"speedup_vs_eager_ci", "tokens_per_s_vs_eager"} & set(key_numbers(s.rung, s.latest))
    assert shown["graph_trainer"]["headline"] == "execution_mode compile: 1.22x (1.14-1.31) kept"
    # the ledger records compile's "vs eager 1.22x (1.14-1.31)" (runs timed apart): not shown any more
    compile_state = next(s for s in states if s.rung == "compile")
    assert compile_state.latest.measurements.get("speedup_vs_eager_ci")
    assert "vs eager" not in key_numbers_text("compile", compile_state.latest)
    # --json through the command line: the same records and headlines
    out = CliRunner().invoke(app, ["status", ws.name, "--dir", str(ws.root.parent.parent), "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["rung"]: r for r in json.loads(out.output)["rungs"]}
    assert {r: rows[r]["headline"] for r in by_rung} == {r: headline(d) for r, d in by_rung.items()}
    assert rows["kernels"]["decisions"] == by_rung["kernels"]


def test_a_hand_broken_decision_record_is_left_out_not_a_crash(demo_ws):  # noqa: F811
    broken = [{"lever": "execution_mode"}, decisions()["graph_trainer"][0]]
    ws = with_decisions(demo_ws, {"graph_trainer": broken})
    shown = {r["rung"]: r for r in status_dict(ws, ladder_states(ws, default_specs()))["rungs"]}
    assert shown["graph_trainer"]["decisions"] == broken[1:]


def test_report_summary_bolds_each_kept_decisions_figure_and_nothing_timed_apart(demo_ws):  # noqa: F811
    by_rung = decisions()
    ws = with_decisions(demo_ws, by_rung)
    files = write_report_files(ws)
    report = files.markdown.read_text()
    summary = report.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "- graph_trainer: execution_mode eager -> compile: **1.22x (1.14-1.31)** kept (99% interval" in summary
    assert "- kernels: kernels.loss plain -> fused_ce: **1.10x (1.05-1.16)** kept" in summary
    assert "naive" not in summary and "bfloat16" not in summary  # held decisions are no headline
    # the ratio of two runs timed apart: in the table, labelled, not bold
    assert "| step time | 211 ms | 171 ms | 1.23x context (timed apart, no interval), not a decision |" in summary
    headlines.check_headlines(ws.root)  # the demo climb's check, on this ledger
    kept = [d for ds in by_rung.values() for d in ds if d["verdict"] == "kept"]
    assert [d["figure"] for d in files.summary["kept_decisions"]] == ["speed", "speed"]
    assert {decision_figure(d) for d in kept} == {"1.22x (1.14-1.31)", "1.10x (1.05-1.16)"}
    for rung, found in by_rung.items():  # each rung's section: its headline and a row per lever
        section = report.split(f"## {rung}: ", 1)[1].split("\n## ", 1)[0]
        assert f"Decisions (headline: {headline(found)}):" in section
        assert section.count("| `kernels.") == (2 if rung == "kernels" else 0)


def test_the_waterfall_bar_of_a_rung_with_decisions_is_its_kept_figure(demo_ws):  # noqa: F811
    by_rung = decisions()
    ws = with_decisions(demo_ws, by_rung)
    steps = {s.rung: s for s in waterfall_steps(records(ladder_states(ws, default_specs())))}
    gt = steps["graph_trainer"]
    assert gt.kind == "kept" and (gt.factor.speedup, gt.factor.low, gt.factor.high) == pytest.approx((1.22, 1.14, 1.31))
    assert gt.factor == decision_factor(by_rung["graph_trainer"][0])
    # compile decides nothing: the mode is graph_trainer's bar, not counted twice
    assert steps["compile"].kind == "not timed" and steps["compile"].factor is None
    # the kernels list: the kept decision's figure, the held one not multiplied in
    assert steps["kernels"].kind == "kept" and steps["kernels"].factor.speedup == pytest.approx(1.1)
    # simple_fsdp held: its one timed decision, not kept
    assert steps["simple_fsdp"].kind == "not kept" and steps["simple_fsdp"].factor.speedup == pytest.approx(1.03)
    assert steps["final"].cumulative.speedup == pytest.approx(1.22 * 1.1)


def test_no_kept_decision_says_so_in_bold_and_nothing_else_is(demo_ws):  # noqa: F811
    ws = with_decisions(demo_ws, decisions(any_kept=False))
    report = write_report_files(ws).markdown.read_text()
    summary = report.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "**No rung kept a change**" in summary and "x**" not in summary
    headlines.check_headlines(ws.root)


def test_a_decision_taken_without_timing_reads_untimed_and_a_failed_timing_not_measured():
    from onboard.ladder.decision import Decision, NOT_ELIGIBLE

    untimed = Decision(rung="kernels", lever="kernels.attention", holder="sdpa", candidate="flash", value="sdpa",
                       verdict=NOT_ELIGIBLE, figure="none", why="flash raised: never timed").to_dict()  # fmt: skip
    failed = decide("kernels", "kernels.loss", holder="plain", candidate="fused_ce",
                    comparison={"outcome": "not measured", "ratio": float("nan"), "ci_low": 0.0, "ci_high": float("inf")}).to_dict()  # fmt: skip
    assert headline([untimed]) == "kernels.attention=flash: untimed not eligible"
    assert headline([failed]) == "kernels.loss=fused_ce: not measured"
