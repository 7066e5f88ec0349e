"""The report's pictures draw what the ledger recorded, and nothing else.

report_ladder.json is a finished demo ladder (`onboard demo`, llama3 debugmodel on the 2-core
CPU), trimmed: every rung's latest entry with its measurements, the loss curves and the
first rows of parity's per-module table; graph_trainer's execution-mode record,
simple_fsdp's bf16-vs-fp32 timing and the kernels rung's tensor peaks per kernel (details.peaks)
as the rungs record them now. The pure functions of
onboard.report.facts and onboard.report.steps are checked against its entries, and the drawn
artists (bar heights, line points, read back from each Figure's Axes) against those functions.
"""

from __future__ import annotations

import copy
import json
import math
import struct
import zlib
from pathlib import Path

import pytest

from onboard.report import pictures as rp
from onboard.report.steps import waterfall_steps
from onboard.report.speed_section import factor_cell
from onboard.report.facts import (
    Record,
    loss_series,
    parity_points,
    speedup,
    waterfall_bars,
)
from onboard.report.memory_facts import memory_bars, policy_bars

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
def test_timed_runs_are_the_recorded_step_times_of_each_rung():
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
    assert (
        facts["speedup"]
        == by["eager"]["measurements"]["step_time_median_s"] / by["compile"]["measurements"]["step_time_median_s"]
    )
    assert [x["label"] for x in facts["not_like_for_like"]] == ["simple_fsdp"]


def speed(cmp: dict) -> tuple[float, float, float]:
    """(speed-up, low, high) of a recorded Comparison: its time ratio and interval, inverted."""
    return 1 / cmp["ratio"], 1 / cmp["ci_high"], 1 / cmp["ci_low"]


def as_tuple(f) -> tuple[float, float | None, float | None]:
    return f.speedup, f.low, f.high


def mode_timing(by: dict, mode: str) -> dict:
    return by["graph_trainer"]["details"]["execution_mode"]["execution_mode_vs_eager"][mode]


def cmp(outcome: str, ratio: float, low: float, high: float) -> dict:
    return {
        "outcome": outcome,
        "ratio": ratio,
        "ci_low": low,
        "ci_high": high,
        "confidence": 0.99,
        "rounds": 9,
        "paired": True,
    }


def bar_of(fig, gid: str):
    """The one bar drawn with `gid`, and its top (bars float from 1)."""
    (rect,) = [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]
    return rect, rect.get_y() + rect.get_height()


def test_waterfall_steps_are_each_rungs_interleaved_timing_against_the_recipe_before():
    entries = attempts()
    by = latest(entries)
    steps = waterfall_steps(recs(entries))
    assert [s.label for s in steps] == [
        "eager",
        "parity",
        "simple_fsdp",
        "compile",
        "graph_trainer",
        "kernels",
        "final recipe",
    ]
    kinds = ["baseline", "not timed", "not kept", "kept", "not kept", "not kept", "final recipe"]
    assert [s.kind for s in steps] == kinds
    eager, parity, fsdp, comp, graph, kernels, final = steps
    assert as_tuple(eager.factor) == (1.0, 1.0, 1.0) and parity.factor is None
    # bf16 params against fp32, interleaved: measured, not kept (indistinguishable: fp32 stays)
    timing = by["simple_fsdp"]["measurements"]["mixed_precision_timing"]
    assert as_tuple(fsdp.factor) == pytest.approx(speed(timing))
    assert (fsdp.factor.outcome, fsdp.factor.protocol, fsdp.source) == ("indistinguishable", True, "simple_fsdp")
    # each mode against eager, as graph_trainer's execution-mode choice timed them
    for step, mode in ((comp, "compile"), (graph, "graph_trainer")):
        assert as_tuple(step.factor) == pytest.approx(speed(mode_timing(by, mode)))
        assert (step.factor.outcome, step.factor.protocol, step.source) == (
            mode_timing(by, mode)["outcome"],
            True,
            "graph_trainer",
        )
        assert step.factor.confidence == pytest.approx(0.99)
    assert kernels.factor is None and kernels.text == "no change kept"  # sdpa was already the recipe's
    # the product of the kept steps: only compile changed the recipe's speed
    assert [s.cumulative.speedup for s in steps[:3]] == [1.0, 1.0, 1.0]
    for s in (comp, graph, kernels, final):
        assert as_tuple(s.cumulative) == pytest.approx(speed(mode_timing(by, "compile")))
        assert s.cumulative.confidence == pytest.approx(0.99) and s.cumulative.protocol
    assert final.factor == final.cumulative


def test_a_kept_choice_shows_its_interleaved_speedup_not_its_run_timed_apart_under_load():
    """compile kept at 0.56x by its own run (timed apart, under load) next to 1.45x interleaved: 1.45x."""
    entries = attempts()
    by = latest(entries)
    eager_s = by["eager"]["measurements"]["step_time_median_s"]
    by["compile"]["measurements"]["step_time_median_s"] = eager_s / 0.56
    mode_timing(by, "compile").update(ratio=1 / 1.45, ci_low=1 / 1.62, ci_high=1 / 1.30)
    runs = {b.label: b for b in waterfall_bars(recs(entries), entries, FINAL_RECIPE)}
    assert eager_s / runs["compile"].step_time_s == pytest.approx(0.56)  # what the old picture drew
    steps = {s.label: s for s in waterfall_steps(recs(entries))}
    compile_step = steps["compile"]
    assert as_tuple(compile_step.factor) == pytest.approx((1.45, 1.30, 1.62))
    assert (compile_step.kind, compile_step.factor.outcome, compile_step.factor.protocol) == ("kept", "faster", True)
    assert as_tuple(steps["final recipe"].cumulative) == pytest.approx((1.45, 1.30, 1.62))
    assert factor_cell(compile_step.factor) == "1.45x (1.30-1.62, 99%) faster"  # REPORT.md's words
    fig = rp.draw_waterfall(list(steps.values()))
    rect, top = bar_of(fig, "step:compile")
    assert top == pytest.approx(1.45) and not rect.get_hatch()
    (whisker,) = [c for c in axes(fig, "waterfall-steps").collections if c.get_gid() == "step:compile-ci"]
    assert [y for _, y in whisker.get_segments()[0]] == pytest.approx([1.30, 1.62])
    texts = [t.get_text() for t in axes(fig, "waterfall-steps").texts]
    assert "1.45x\n(1.30-1.62)\nfaster" in texts and not any("0.56" in t for t in texts)


def test_rungs_without_an_interleaved_record_are_timed_apart_hatched_and_the_png_writes(tmp_path):
    entries = attempts()
    by = latest(entries)
    del by["graph_trainer"]["details"]["execution_mode"]  # a ledger from before the records were kept
    del by["simple_fsdp"]["measurements"]["mixed_precision_timing"]
    steps = {s.label: s for s in waterfall_steps(recs(entries))}
    m = {r: by[r]["measurements"] for r in by}
    eager_s = m["eager"]["step_time_median_s"]
    expected = {
        "simple_fsdp": m["simple_fsdp"]["step_time_median_s"] / m["simple_fsdp"]["bf16_step_time_median_s"],
        "compile": eager_s / m["compile"]["step_time_median_s"],
        "graph_trainer": eager_s / m["graph_trainer"]["step_time_median_s"],
    }
    for rung, value in expected.items():
        f = steps[rung].factor
        assert (f.speedup, f.low, f.high, f.protocol, f.outcome) == (pytest.approx(value), None, None, False, None)
        assert steps[rung].source == rung and steps[rung].text.endswith("context (timed apart, no interval)")
    final = steps["final recipe"].cumulative  # compile was kept: the product has no interval
    assert (final.speedup, final.low, final.protocol) == (pytest.approx(expected["compile"]), None, False)
    assert steps["eager"].factor.protocol and steps["parity"].factor is None
    fig = rp.draw_waterfall(list(steps.values()))
    for rung in expected:
        rect, top = bar_of(fig, f"step:{rung}")
        assert rect.get_hatch() == rp.HATCH and top == pytest.approx(expected[rung])
    texts = [t.get_text() for t in axes(fig, "waterfall-steps").texts]
    assert texts.count(f"{expected['compile']:.2f}x\ncontext:\ntimed apart,\nno interval") == 1
    assert not [c for ax in fig.axes for c in ax.collections if (c.get_gid() or "").endswith("-ci")]  # no whisker
    assert "context (timed apart, no interval)" in [t.get_text() for t in fig.legends[0].get_texts()]
    path = rp.write_picture(fig, tmp_path / "waterfall.png")
    assert png_size(path.read_bytes()) == (round(fig.get_figwidth() * rp.DPI), round(fig.get_figheight() * rp.DPI))


def test_kernel_and_tuning_steps_multiply_their_kept_comparisons_and_the_union_bound_counts_them():
    entries = attempts()
    by = latest(entries)
    km = by["kernels"]["measurements"]
    # attention sdpa -> tokamax, no head to head: tokamax's ratio over sdpa's, both against the plain path
    km.update(
        attention_tokamax_time_ratio=0.6,
        attention_tokamax_time_ratio_ci=[0.55, 0.66],
        attention_tokamax_timing="faster",
    )
    by["kernels"]["details"]["decisions"]["attention"].update(value="tokamax", was="sdpa", edit=True)
    changes = [
        {"step": "block_sizes", "change": "ce_chunk=1024", "against": "untuned", "kept": True,
         "timing": cmp("faster", 0.9, 0.85, 0.95)},
        {"step": "batch", "change": "batch=16", "against": "batch=8", "kept": True,
         "timing": cmp("faster", 0.8, 0.7, 0.9)},  # against the search's last holder: its chain says more
        {"step": "flags", "change": "threads", "against": "batch=16", "kept": False,
         "timing": cmp("faster", 0.5, 0.4, 0.6)},  # not kept: not multiplied in
    ]  # fmt: skip
    doublings = [cmp("faster", 0.7, 0.6, 0.8), cmp("faster", 0.8, 0.7, 0.9)]  # ce_chunk's batch 4 -> 8 -> 16
    tried = [{"outcome": "start"}] + [{"outcome": "faster", "comparison": c} for c in doublings]
    tried.append({"outcome": "slower", "comparison": cmp("slower", 1.2, 1.1, 1.3)})
    entries.append(
        {
            "rung": "tuning",
            "attempt": 1,
            "status": "passed",
            "started": "2026-12-01T09:26:00+00:00",
            "ended": "2026-12-01T09:27:00+00:00",
            "measurements": {"step_time_median_s": 0.3},
            "details": {"changes": changes, "batch": {"tried": tried}},
        }
    )
    steps = {s.label: s for s in waterfall_steps(recs(entries))}
    kernels, tuning, final = steps["kernels"], steps["tuning"], steps["final recipe"]
    sdpa = (km["attention_sdpa_time_ratio"], *km["attention_sdpa_time_ratio_ci"])
    assert as_tuple(kernels.factor) == pytest.approx((sdpa[0] / 0.6, sdpa[1] / 0.66, sdpa[2] / 0.55))
    assert (kernels.kind, kernels.factor.links, kernels.factor.outcome) == ("kept", 2, "faster")
    links = [changes[0]["timing"], *doublings]
    assert as_tuple(tuning.factor) == pytest.approx(tuple(math.prod(x) for x in zip(*map(speed, links))))
    assert (tuning.kind, tuning.factor.links, tuning.factor.confidence) == ("kept", 3, pytest.approx(0.97))
    assert tuning.what == "kept ce_chunk=1024, batch=16"
    kept = [speed(mode_timing(by, "compile")), as_tuple(kernels.factor), as_tuple(tuning.factor)]
    assert as_tuple(final.cumulative) == pytest.approx(tuple(math.prod(x) for x in zip(*kept)))
    assert (final.cumulative.links, final.cumulative.confidence) == (6, pytest.approx(0.94))  # 1 + 2 + 3 intervals
    fig = rp.draw_waterfall(list(steps.values()))
    assert bar_of(fig, "cumulative:final")[1] == pytest.approx(final.cumulative.speedup)
    assert any(t.get_text().endswith("faster, >= 94%") for t in axes(fig, "waterfall-cumulative").texts)


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
    assert "compile" not in [s.rung for s in waterfall_steps(records)]
    records = [Record(r.rung, "stale" if r.rung == "compile" else r.status, r.entry) for r in recs(entries)]
    assert "compile (stale)" in [b.label for b in waterfall_bars(records, entries, FINAL_RECIPE)]
    no_eager = [Record(r.rung, "invalid" if r.rung == "eager" else r.status, r.entry) for r in recs(entries)]
    assert waterfall_bars(no_eager, entries, FINAL_RECIPE) == [] and waterfall_steps(no_eager) == []
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
    expected = [
        (r, v)
        for r, e in by.items()
        for k, v in e["measurements"].items()
        if k.endswith("peak_mem_bytes") and not k.startswith(("eager_", "baseline_"))
    ]
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
