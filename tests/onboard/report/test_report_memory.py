"""The memory picture draws the kernels rung's tensor bytes per kernel (the unit its memory rule
decides by) beside each run's peak (on CPU the process's RSS), each axis labelled with its unit,
and says so where the ledger holds no tensor figure instead of drawing a zero.

The ledger is the demo's (report_ladder.json): its kernels entry's `details.peaks` are the tensor
peaks the same demo run measured, the ones its recorded memory savings were computed from."""

from __future__ import annotations

import pytest

from onboard.report import pictures as rp
from onboard.report.memory_facts import memory_bars, policy_bars, tensor_lines, tensor_peaks
from onboard.report.write import MEMORY, write_report_files
from test_report_files import demo_ws  # noqa: F401 (the fixture)
from test_report_pictures import attempts, axes, latest, png_size, recs


def kernels_entry(entries: list[dict]) -> dict:
    return latest(entries)["kernels"]


def bar_heights(ax) -> list[float]:
    return [r.get_height() for c in ax.containers for r in c.patches]


def test_tensor_peaks_are_the_recorded_ones_and_give_the_recorded_memory_savings():
    entries = attempts()
    k = kernels_entry(entries)
    t = tensor_peaks(recs(entries))
    assert t.why_none == "" and t.device == "cpu" and "dispatcher" in t.unit
    assert {b.label: b.peak_bytes for b in t.bars} == k["details"]["peaks"]
    assert [b.label for b in t.bars if b.held] == ["loss=plain", "attention=sdpa"]  # the recipe's choices
    by = {b.label: b for b in t.bars}
    m = k["measurements"]
    # the saving the kernels rung decided by is these tensor bytes against the holder's
    assert by["loss=fused_ce"].saving == m["loss_fused_ce_memory_saving"]
    assert by["loss=fused_ce"].saving == pytest.approx(1 - by["loss=fused_ce"].peak_bytes / by["loss=plain"].peak_bytes)
    sdpa, naive = by["attention=sdpa"], by["attention=naive"]
    assert sdpa.saving == pytest.approx(1 - sdpa.peak_bytes / naive.peak_bytes)
    assert by["attention=tokamax"].peak_bytes is None and by["attention=tokamax"].saving is None  # JAX-backed
    lines = tensor_lines(t)
    assert "- kernels.loss=fused_ce: 71.3 MiB, 7% less than its holder" in lines
    assert "- kernels.attention=tokamax: not measured" in lines
    assert "- kernels.loss=plain (the recipe holds it): 76.8 MiB" in lines


def test_the_memory_picture_draws_tensor_bytes_per_kernel_beside_the_runs_rss(tmp_path):
    entries = attempts()
    r = recs(entries)
    mem, (rung, policies), t = memory_bars(r), policy_bars(r), tensor_peaks(r)
    fig = rp.draw_memory(mem, rung, policies, device="cpu", tensors=t)
    runs, kernels = axes(fig, "peak-memory"), axes(fig, "tensor-peaks")
    assert bar_heights(runs) == [b.peak_mem_bytes / rp.MIB for b in mem]
    assert "RSS" in runs.get_ylabel() and "MiB" in runs.get_ylabel()
    measured = [b for b in t.bars if b.peak_bytes is not None]
    assert bar_heights(kernels) == [b.peak_bytes / rp.MIB for b in measured]  # tokamax: no bar, not a zero
    (container,) = kernels.containers
    assert [p.get_x() + p.get_width() / 2 for p in container.patches] == [
        i for i, b in enumerate(t.bars) if b.peak_bytes is not None
    ]
    assert "MiB" in kernels.get_ylabel() and "tensor bytes" in kernels.get_ylabel()
    texts = [x.get_text() for x in kernels.texts]
    assert texts.count("not\nmeasured") == 1 and "71.3 MiB\n7% less than\nits holder" in texts
    ticks = [x.get_text() for x in kernels.get_xticklabels()]
    assert ticks == [b.label + (" (recipe)" if b.held else "") for b in t.bars]
    assert axes(fig, "saved-activations") is not None
    path = rp.write_picture(fig, tmp_path / "memory.png")
    assert png_size(path.read_bytes()) == (round(fig.get_figwidth() * rp.DPI), round(fig.get_figheight() * rp.DPI))


@pytest.mark.parametrize("older", ["no peaks", "no kernels rung"])
def test_an_older_ledger_without_tensor_figures_says_so_and_draws_no_zero(older):
    entries = attempts()
    if older == "no peaks":  # a kernels entry from before details.peaks
        del kernels_entry(entries)["details"]["peaks"]
    else:
        entries = [e for e in entries if e["rung"] != "kernels"]
    r = recs(entries)
    t = tensor_peaks(r)
    assert t.bars == []
    why = "predates the per-kernel tensor peaks" if older == "no peaks" else "the kernels rung has not run"
    assert why in t.why_none
    assert tensor_lines(t) == [f"Tensor memory per kernel: {t.why_none}.", ""]
    fig = rp.draw_memory(memory_bars(r), *policy_bars(r), device="cpu", tensors=t)
    ax = axes(fig, "tensor-peaks")
    assert not ax.containers and not ax.patches  # nothing drawn as a bar, so no zero
    (note,) = [x for x in ax.texts if x.get_gid() == "tensor-peaks-none"]
    assert " ".join(note.get_text().split()) == t.why_none


def test_the_report_writes_the_tensor_figures_under_the_memory_picture(demo_ws):  # noqa: F811
    files = write_report_files(demo_ws)
    assert files.picture(MEMORY) is not None
    report = files.markdown.read_text()
    pictures = report.split("## Pictures", 1)[1].split("\n## ", 1)[0]
    below = pictures.split(f"]({MEMORY})", 1)[1]
    assert below.lstrip().startswith("Tensor memory per kernel (the kernels rung's fp32 forward + backward, tensor "
                                     "bytes counted at the dispatcher")  # fmt: skip
    assert "- kernels.loss=fused_ce: 71.3 MiB, 7% less than its holder" in below
    shown = {b["field"] + "=" + b["value"]: b["peak_bytes"] for b in files.summary["tensor_peaks"]}
    assert shown == kernels_entry(attempts())["details"]["peaks"]
