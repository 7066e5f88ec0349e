"""The report's pictures draw what the ledger recorded, and nothing else.

report_ladder.json is a finished demo ladder (`onboard demo`, llama3 debugmodel on the 2-core
CPU), trimmed: every rung's latest entry with its measurements, the loss curves and the
first rows of parity's per-module table. The pure functions of onboard.report.facts are
checked against its entries, and the drawn artists (bar heights, line points, read back
from each Figure's Axes) against those functions.
"""

from __future__ import annotations

import copy
import json
import struct
import zlib
from pathlib import Path

import pytest

from onboard.report import pictures as rp
from onboard.engine.ladder import default_specs, ladder_states
from onboard.engine.ledger import Ledger
from onboard.engine.recipe_edit import apply_edits
from onboard.report.write import HTML, LOSS, MEMORY, PARITY, WATERFALL, write_report_files
from onboard.report.facts import (
    Record,
    loss_series,
    memory_bars,
    parity_points,
    policy_bars,
    speedup,
    waterfall_bars,
)
from onboard.rungs.contract import RecipeEdit
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.layout import Workspace

FIXTURE = json.loads((Path(__file__).parent / "report_ladder.json").read_text())
FINAL_RECIPE = {"compile": {"enable": True}}  # what graph_trainer's recorded edit left in the demo recipe
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def attempts() -> list[dict]:
    return copy.deepcopy(FIXTURE["attempts"])


def latest(entries: list[dict]) -> dict[str, dict]:
    return {e["rung"]: e for e in entries}


def recs(entries: list[dict], status: str = "passed") -> list[Record]:
    return [Record(rung, status, e) for rung, e in latest(entries).items()]


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, checking the signature, the chunk CRC and the IEND end."""
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert zlib.crc32(data[12:29]) == struct.unpack(">I", data[29:33])[0]
    assert depth == 8 and color in (2, 6)  # 8-bit RGB(A): what Agg writes
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
    return width, height


def axes(fig, gid: str):
    return next(ax for ax in fig.axes if ax.get_gid() == gid)


def heights(ax) -> list[float]:
    (container,) = ax.containers
    return [r.get_height() for r in container.patches]


# ---- the waterfall -------------------------------------------------------------------------------
def test_waterfall_bars_are_the_recorded_step_times_of_each_rung():
    entries = attempts()
    by = latest(entries)
    bars = waterfall_bars(recs(entries), entries, FINAL_RECIPE)
    assert [b.label for b in bars] == ["eager", "simple_fsdp", "compile", "graph_trainer", "kernels", "final recipe"]
    for b in bars:
        m = by[b.source]["measurements"]
        assert (b.step_time_s, b.tokens_per_s) == (m["step_time_median_s"], m["tokens_per_s"])
    measured = {b.rung: b for b in bars if b.measured}
    assert set(measured) == {"eager", "simple_fsdp", "compile", "graph_trainer", "final"}
    assert "parity" not in {b.rung for b in bars}  # correctness only: no bar
    # what each rung kept, from its own record: graph_trainer chose the compile mode
    assert [measured[r].kept for r in ("eager", "simple_fsdp", "compile", "graph_trainer")] == [None, True, True, False]
    kernels = bars[4]
    assert (kernels.source, kernels.kept, kernels.measured) == ("compile", False, False)  # carried: nothing new kept
    assert "no new kernel kept" in kernels.change and "loss=fused_ce indistinguishable" in kernels.change
    # the final recipe is the one the compile rung timed (compile.enable=true, edited after: one of its flags)
    assert (bars[-1].source, bars[-1].measured) == ("compile", True)
    # simple_fsdp ran 2 processes: not like-for-like, and named so
    assert not measured["simple_fsdp"].comparable and "2 processes" in measured["simple_fsdp"].setting
    facts = speedup(bars)
    assert facts["speedup"] == by["eager"]["measurements"]["step_time_median_s"] / by["compile"]["measurements"][
        "step_time_median_s"
    ]
    assert [x["label"] for x in facts["not_like_for_like"]] == ["simple_fsdp"]


def test_waterfall_picture_draws_exactly_those_bars():
    entries = attempts()
    bars = waterfall_bars(recs(entries), entries, FINAL_RECIPE)
    fig = rp.draw_waterfall(bars)
    step_ax, tok_ax = axes(fig, "waterfall-step-time"), axes(fig, "waterfall-tokens-per-s")
    assert heights(step_ax) == [b.step_time_s for b in bars]
    assert heights(tok_ax) == [b.tokens_per_s for b in bars]
    ticks = [t.get_text() for t in tok_ax.get_xticklabels()]
    assert len(ticks) == len(bars)
    for tick, b in zip(ticks, bars):  # the rung and its change are written under each bar
        assert tick.startswith(b.label + "\n") and b.change.split()[0] in tick
    patches = step_ax.containers[0].patches
    assert [bool(p.get_hatch()) for p in patches] == [b.rung == "simple_fsdp" for b in bars]
    assert patches[4].get_facecolor()[:3] == (1.0, 1.0, 1.0)  # the carried kernels bar is hollow
    width, height = png_size(rp.png_bytes(fig))
    assert (width, height) == (round(fig.get_figwidth() * rp.DPI), round(fig.get_figheight() * rp.DPI))


def test_a_kept_kernel_after_the_last_timed_run_leaves_the_final_recipe_untimed():
    entries = attempts()
    kernels = latest(entries)["kernels"]
    kernels["details"]["decisions"]["loss"].update(value="fused_ce", edit=True)
    edit = {"key": "kernels.loss", "value": "fused_ce", "why": "kernels rung: faster"}
    kernels["recipe_edit"] = {"file": "recipe.toml", "edits": [edit]}
    recipe = {"compile": {"enable": True}, "kernels": {"loss": "fused_ce"}}
    bars = waterfall_bars(recs(entries), entries, recipe)
    assert (bars[4].label, bars[4].kept, bars[4].change) == ("kernels", True, "kept kernels.loss=fused_ce")
    final = bars[-1]
    assert (final.source, final.measured) == ("compile", False)  # carried, never passed off as measured
    assert "not timed as a whole" in final.change


def test_eager_stays_the_final_recipe_when_no_mode_was_faster():
    entries = attempts()
    by = latest(entries)
    by["graph_trainer"]["measurements"]["execution_mode"] = "eager"
    by["kernels"]["measurements"]["execution_mode"] = "eager"
    del by["graph_trainer"]["recipe_edit"]
    bars = waterfall_bars(recs(entries), entries, {})
    assert [b.kept for b in bars if b.rung in ("compile", "graph_trainer")] == [False, False]
    assert (bars[-1].source, bars[-1].measured) == ("eager", True)
    assert bars[4].source == "eager"  # the carried kernels bar carries the recipe so far: eager


def test_a_tuning_entry_with_a_step_time_simply_appears_in_rung_order():
    entries = attempts()
    tuning = {
        "rung": "tuning", "attempt": 1, "status": "passed",
        "started": "2026-12-01T09:26:00+00:00", "ended": "2026-12-01T09:27:00+00:00",
        "measurements": {"step_time_median_s": 0.30, "tokens_per_s": 3400.0, "mfu": 0.5, "peak_mem_bytes": 9 * 2**20,
                         "batch_size": 8, "seq_len": 128, "flags": "--compile.enable=true --training.batch_size=8"},
        "details": {"loss_curve": [7.6, 7.0]},
        "recipe_edit": {"file": "recipe.toml", "edits": [{"key": "training.batch_size", "value": 8, "why": "tuning"}]},
    }  # fmt: skip
    entries.append(tuning)
    recipe = {"compile": {"enable": True}, "training": {"batch_size": 8}}
    bars = waterfall_bars(recs(entries), entries, recipe)
    assert [b.label for b in bars][-3:] == ["kernels", "tuning", "final recipe"]
    assert (bars[-2].step_time_s, bars[-2].kept, bars[-2].change) == (0.30, True, "kept training.batch_size=8")
    assert (bars[-1].source, bars[-1].step_time_s, bars[-1].measured) == ("tuning", 0.30, True)
    # another batch: its tokens/s compare with the baseline's, its step time does not
    assert bars[-1].comparable and not bars[-1].same_batch
    assert "tuning" in [x["label"] for x in speedup(bars)["not_like_for_like"]]
    assert any(s.rung == "tuning" for s in loss_series(recs(entries)))


def test_failed_and_invalid_rungs_get_no_bar_and_no_eager_means_no_waterfall():
    entries = attempts()
    records = [Record(r.rung, "failed" if r.rung == "compile" else r.status, r.entry) for r in recs(entries)]
    assert "compile" not in [b.rung for b in waterfall_bars(records, entries, FINAL_RECIPE)]
    records = [Record(r.rung, "stale" if r.rung == "compile" else r.status, r.entry) for r in recs(entries)]
    assert "compile (stale)" in [b.label for b in waterfall_bars(records, entries, FINAL_RECIPE)]
    no_eager = [Record(r.rung, "invalid" if r.rung == "eager" else r.status, r.entry) for r in recs(entries)]
    assert waterfall_bars(no_eager, entries, FINAL_RECIPE) == []
    assert speedup([]) is None


# ---- loss, parity, memory ------------------------------------------------------------------------
def test_loss_picture_overlays_every_recorded_curve_on_the_eager_baseline():
    entries = attempts()
    by = latest(entries)
    series = loss_series(recs(entries))
    assert series[0].baseline and series[0].values == by["eager"]["details"]["loss_curve"]
    recorded = {(r, k) for r, e in by.items() for k in e["details"] if k.endswith("loss_curve")}
    assert {(s.rung, s.key) for s in series} == recorded
    fig = rp.draw_loss(series)
    lines = {line.get_gid(): list(line.get_ydata()) for line in axes(fig, "loss").get_lines()}
    for s in series:
        assert lines[f"loss:{s.rung}:{s.key}"] == s.values
    diff = {line.get_gid(): list(line.get_ydata()) for line in axes(fig, "loss-diff").get_lines()}
    compile_diff = diff["diff:compile:loss_curve"]
    eager_curve = by["eager"]["details"]["loss_curve"]
    assert compile_diff == [abs(a - b) / b for a, b in zip(by["compile"]["details"]["loss_curve"], eager_curve)]
    assert diff["diff:simple_fsdp:fsdp2_loss_curve"][0] == 0.0  # the same step-1 loss, drawn at 0
    png_size(rp.png_bytes(fig))


def test_parity_picture_draws_each_modules_error_against_the_tolerance():
    results = FIXTURE["parity_results"]
    table = results["localisation"]["table"]
    points = parity_points(results, "passed")
    assert points.modules == [r["native"] for r in table] and points.rel_l2 == [r["rel_l2"] for r in table]
    assert points.tolerance == results["localisation"]["tolerance_rel_l2"] == 1e-5
    fig = rp.draw_parity(points)
    ax = axes(fig, "parity")
    by_gid = {line.get_gid(): line for line in ax.get_lines()}
    positive = [(i, v) for i, v in enumerate(points.rel_l2) if v > 0]
    assert list(by_gid["parity-error"].get_xdata()) == [i for i, _ in positive]
    assert list(by_gid["parity-error"].get_ydata()) == [v for _, v in positive]
    zeros = [i for i, v in enumerate(points.rel_l2) if v == 0]
    assert zeros and list(by_gid["parity-zero"].get_xdata()) == zeros
    assert list(by_gid["parity-tolerance"].get_ydata()) == [1e-5, 1e-5]
    assert max(v for _, v in positive) < 1e-5  # the demo's parity passed: every point under the line
    assert [t.get_text() for t in ax.get_xticklabels()] == points.modules
    png_size(rp.png_bytes(fig))


def test_parity_picture_marks_the_first_divergence_and_uncompared_modules():
    results = copy.deepcopy(FIXTURE["parity_results"])
    table = results["localisation"]["table"]
    table[7]["rel_l2"], table[8]["rel_l2"], table[9]["rel_l2"] = 3e-2, None, float("inf")
    results["localisation"]["first"] = {"native": table[7]["native"]}
    points = parity_points(results, "failed")
    assert points.first == table[7]["native"]
    ax = axes(rp.draw_parity(points), "parity")
    by_gid = {line.get_gid(): line for line in ax.get_lines()}
    assert 7 in list(by_gid["parity-error"].get_xdata()) and 9 not in list(by_gid["parity-error"].get_xdata())
    assert list(by_gid["parity-missing"].get_xdata()) == [8]
    assert list(by_gid["parity-off-scale"].get_xdata()) == [9]
    assert by_gid["parity-off-scale"].get_ydata()[0] > 3e-2  # above every finite point
    assert any(table[7]["native"] in t.get_text() for t in ax.texts)
    assert parity_points({"localisation": {"tolerance_rel_l2": 1e-5}}, "passed") is None  # no table: no picture


def test_memory_picture_draws_recorded_peaks_and_saved_activations_per_policy():
    entries = attempts()
    by = latest(entries)
    mem = memory_bars(recs(entries))
    expected = [(r, v) for r, e in by.items() for k, v in e["measurements"].items()
                if k.endswith("peak_mem_bytes") and not k.startswith(("eager_", "baseline_"))]  # fmt: skip
    assert [(b.rung, b.peak_mem_bytes) for b in mem] == expected
    rung, policies = policy_bars(recs(entries))
    gm = by["graph_trainer"]["measurements"]
    assert rung == "graph_trainer"
    assert {p.policy: p.device_bytes for p in policies} == {
        k.removeprefix("saved_activation_bytes_"): v for k, v in gm.items() if k.startswith("saved_activation_bytes_")
    }
    assert [p.policy for p in policies if p.chosen] == [gm["memory_policy_choice"]]
    fig = rp.draw_memory(mem, rung, policies, device="cpu")
    assert heights(axes(fig, "peak-memory")) == [b.peak_mem_bytes / rp.MIB for b in mem]
    saved = axes(fig, "saved-activations")
    device, host = saved.containers
    assert [r.get_height() for r in device.patches] == [p.device_bytes / rp.MIB for p in policies]
    assert [r.get_height() for r in host.patches] == [p.host_bytes / rp.MIB for p in policies]
    assert "resident set" in axes(fig, "peak-memory").get_ylabel()


# ---- onboard report, end to end ------------------------------------------------------------------
@pytest.fixture
def demo_ws(tmp_path) -> Workspace:
    """A scaffolded workspace holding the demo's ledger, its recipe edit applied and the
    recorded file hashes made this workspace's own (so every rung reads passed, not stale)."""
    root = write_workspace(plan_workspace("llama3_debug", tmp_path, preset="llama3/debugmodel", device="cpu"))
    apply_edits(root / "recipe.toml", [RecipeEdit("compile.enable", True, "graph_trainer rung: compile is faster")])
    ws = Workspace.load(tmp_path, "llama3_debug")
    data = json.loads((root / "ladder.json").read_text())
    data["attempts"] = attempts()
    for e in data["attempts"]:
        e["files_read"] = ws.hashes(list(e["files_read"]))
        e["environment"]["device"] = "cpu" if e["rung"] != "parity" else "auto"
    (root / "ladder.json").write_text(json.dumps(data, indent=1))
    parity = next(e for e in data["attempts"] if e["rung"] == "parity")
    (root / parity["attempt_dir"]).mkdir(parents=True)
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
        "**cpu**", "5,573,888 parameters", "final recipe (compile rung)",
        "| step time | 211 ms | 171 ms | **1.23x** speed-up (two runs timed apart: no interval) |", "| tokens/s | 2,429 | 2,988 | 1.23x |",
        "| MFU | 36.5% | 44.9% |", "| peak memory | 553 MiB | 670 MiB |",
        "Not like-for-like", "**simple_fsdp** (2 processes", "Waivers: none.",
    ):  # fmt: skip
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
