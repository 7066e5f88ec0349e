"""onboard report end to end: the files it writes (pictures, REPORT.md, report.html) for a
workspace with runs and for a fresh one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onboard.ladder.table import default_specs
from onboard.ladder.states import ladder_states
from onboard.workspace.ledger import Ledger
from onboard.ladder.recipe_edit import apply_edits
from onboard.report.steps import waterfall_steps
from onboard.report.speed_section import factor_cell
from onboard.report.write import HTML, LOSS, MEMORY, PARITY, WATERFALL, write_report_files
from onboard.ladder.contract import RecipeEdit
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.layout import Workspace

FIXTURE = json.loads((Path(__file__).parent / "report_ladder.json").read_text())
FINAL_RECIPE = {"compile": {"enable": True}}  # what graph_trainer's recorded edit left in the demo recipe
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
from test_report_pictures import attempts, latest, mode_timing, png_size, recs, speed
from attempt_folders import write_attempt_folder


# ---- onboard report, end to end ------------------------------------------------------------------
@pytest.fixture
def demo_ws(tmp_path) -> Workspace:
    """A scaffolded workspace holding the demo's ledger, its recipe edit applied, the recorded
    file hashes made this workspace's own and each attempt's folder holding the record and the
    metrics files its run wrote (attempt_folders.py; so every rung reads passed, not stale or invalid)."""
    root = write_workspace(plan_workspace("llama3_debug", tmp_path, preset="llama3/debugmodel", device="cpu"))
    apply_edits(root / "recipe.toml", [RecipeEdit("compile.enable", True, "graph_trainer rung: compile is faster")])
    ws = Workspace.load(tmp_path, "llama3_debug")
    data = json.loads((root / "ladder.json").read_text())
    data["attempts"] = attempts()
    for e in data["attempts"]:
        e["files_read"] = ws.hashes(list(e["files_read"]))
        e["environment"]["device"] = "cpu" if e["rung"] != "parity" else "auto"
    # each attempt folder as the engine writes it: its record, and the metrics of every run it counts
    data["attempts"] = [write_attempt_folder(ws, e) for e in data["attempts"]]
    (root / "ladder.json").write_text(json.dumps(data, indent=1))
    parity = next(e for e in data["attempts"] if e["rung"] == "parity")
    (root / parity["attempt_dir"] / "results.json").write_text(json.dumps(FIXTURE["parity_results"]))
    return Workspace.load(tmp_path, "llama3_debug")


def test_report_writes_the_pictures_the_summary_and_a_self_contained_html(demo_ws):
    ws = demo_ws
    states = {s.rung: s.status for s in ladder_states(ws, default_specs())}
    assert all(states[r] == "passed" for r in ("eager", "parity", "simple_fsdp", "compile", "graph_trainer", "kernels"))
    files = write_report_files(ws)
    names = [WATERFALL, LOSS, PARITY, MEMORY]
    assert [p.name for p in files.pictures] == names
    for name in names:
        width, height = png_size((ws.root / name).read_bytes())
        assert 400 <= width <= 4000 and 300 <= height <= 2000, (name, width, height)
    report = files.markdown.read_text()
    # the ten-second summary comes first, with the recorded numbers
    assert report.index("## Summary") < report.index("## Pictures") < report.index("## Ladder")
    summary = report.split("## Summary", 1)[1].split("\n## ", 1)[0]
    for text in (
        "**cpu**",
        "5,573,888 parameters",
        "final recipe (compile rung)",
        "| step time | 211 ms | 171 ms | 1.23x context (timed apart, no interval), not a decision |",
        "| tokens/s | 2,429 | 2,988 | 1.23x context (timed apart, no interval), not a decision |",
        "| MFU | 36.5% | 44.9% |",
        "| peak memory | 553 MiB | 670 MiB |",
        "Not like-for-like",
        "**simple_fsdp** (2 processes",
        "Waivers: none.",
    ):
        assert text in summary, text
    for name in names:
        assert f"]({name})" in report
    page = (ws.root / HTML).read_text()
    sources = page.count('src="')
    assert sources == len(names) == page.count('src="data:image/png;base64,')  # nothing fetched from outside
    assert "<table>" in page and "<h2>Summary</h2>" in page
    out = files.to_json()
    assert out["html"] == str(ws.root / HTML) and out["waterfall"] == str(ws.root / WATERFALL)
    assert out["summary"]["speedup"] == pytest.approx(1.2302, abs=1e-4) and out["pictures_not_drawn"] == {}
    # beside the picture, the same numbers it draws: each rung's interleaved speed-up and the product
    by = latest(attempts())
    compile_cell = factor_cell(waterfall_steps(recs(attempts()))[3].factor)
    assert compile_cell == "1.22x (1.14-1.31, 99%) faster"
    assert "| kept figures multiplied | 1x |  | 1.22x (1.14-1.31, 99%) faster: " in summary
    # a ledger older than decision records: nothing is bold that is not a decision, and it says so
    assert "Decisions: none recorded yet" in summary and "x**" not in summary
    pictures = report.split("## Pictures", 1)[1].split("\n## ", 1)[0]
    assert f"| 3 | compile | compile mode vs eager: compile chosen | kept | {compile_cell} |" in pictures
    assert "*context (timed apart, no interval)*" in pictures and "union bound" in pictures
    assert compile_cell in page and "context (timed apart, no interval)" in page
    protocol = out["summary"]["protocol_speedup"]
    assert (protocol["speedup"], protocol["protocol"]) == (pytest.approx(speed(mode_timing(by, "compile"))[0]), True)


def test_report_of_a_fresh_workspace_draws_nothing_and_says_why(demo_ws):
    ws = demo_ws
    write_report_files(ws)
    assert (ws.root / WATERFALL).is_file()
    ledger = Ledger.load(ws.root / "ladder.json")
    ledger.data["attempts"] = []
    ledger.save()
    files = write_report_files(Workspace.load(ws.root.parent.parent, ws.name))
    assert all(p.path is None and p.why for p in files.pictures)
    assert not any((ws.root / p.name).exists() for p in files.pictures)  # the earlier pictures are gone
    report = files.markdown.read_text()
    assert "no passed eager run yet" in report and "not drawn: no passed eager run to start from" in report
    assert 'src="' not in (ws.root / HTML).read_text()
