"""The report's pictures: PNGs drawn with matplotlib's Agg canvas, from onboard.report.facts.

Each `draw_*` takes the data report_data computed from the ledger and returns a Figure
that draws exactly that data (a test reads the bar heights and line points back from its
Axes, found by gid). The object API is used (Figure + FigureCanvasAgg), never pyplot: no
global state, no display, and `matplotlib` is imported only when a picture is drawn, so
the other commands do not pay for it. PNGs carry no timestamp or version metadata.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from onboard.workspace.fsutil import atomic_write_bytes
from onboard.report.facts import BASELINE, Bar, MemoryBar, ParityPoints, PolicyBar, Series

DPI = 110
MIB = 2**20
COLORS = {
    "baseline": "#7f7f7f",
    "kept": "#2ca02c",
    "not kept": "#e377c2",
    "not decided": "#9ecae1",
    "final recipe": "#1f4e79",
}
HATCH = "//"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes; no Software/time metadata, so equal pictures are equal bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "not recorded"
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "not recorded"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / MIB:.0f} MiB"


# ---- waterfall -------------------------------------------------------------------------------
def bar_kind(bar: Bar) -> str:
    if bar.rung == "final":
        return "final recipe"
    if bar.kept is None:
        return "baseline" if bar.rung == BASELINE else "not decided"
    return "kept" if bar.kept else "not kept"


def _tick(bar: Bar) -> str:
    lines = textwrap.wrap(bar.change, 22)
    lines = lines[:5] + (["..."] if len(lines) > 5 else [])
    return "\n".join([bar.label, *lines, f"[{bar_kind(bar)}]"])


def _bars(ax, bars: list[Bar], key: str, *, like_for_like) -> None:
    heights = [getattr(b, key) or 0.0 for b in bars]
    container = ax.bar(range(len(bars)), heights, width=0.7, gid=key)
    for rect, b in zip(container.patches, bars):
        color = COLORS[bar_kind(b)]
        if b.measured:
            rect.set_facecolor(color)
        else:  # carried: the recipe so far, not re-timed
            rect.set_facecolor("white")
            rect.set_linestyle("--")
        rect.set_edgecolor(color if not b.measured else "black")
        rect.set_linewidth(1.2)
        if b.measured and not like_for_like(b):
            rect.set_hatch(HATCH)
    ax.set_ylim(0, max(heights) * 1.32 if max(heights) > 0 else 1)


def draw_waterfall(bars: list[Bar]):
    """Step time (top) and tokens/s (bottom) per bar, baseline first, final recipe last."""
    from matplotlib.patches import Patch

    fig = _figure(max(7.5, 1.75 * len(bars) + 1.5), 8.2)
    ax_t, ax_k = fig.subplots(2, 1, sharex=True)
    base = bars[0]
    _bars(ax_t, bars, "step_time_s", like_for_like=lambda b: b.comparable and b.same_batch)
    _bars(ax_k, bars, "tokens_per_s", like_for_like=lambda b: b.comparable)
    for i, b in enumerate(bars):
        if b.step_time_s:
            ratio = f"\n{base.step_time_s / b.step_time_s:.2f}x" if base.step_time_s else ""
            ax_t.annotate(fmt_seconds(b.step_time_s) + ratio, (i, b.step_time_s), ha="center", va="bottom",
                          fontsize=8, xytext=(0, 2), textcoords="offset points")  # fmt: skip
        if b.tokens_per_s:
            ratio = f"\n{b.tokens_per_s / base.tokens_per_s:.2f}x" if base.tokens_per_s else ""
            ax_k.annotate(f"{b.tokens_per_s:,.0f}{ratio}", (i, b.tokens_per_s), ha="center", va="bottom",
                          fontsize=8, xytext=(0, 2), textcoords="offset points")  # fmt: skip
    ax_t.set_gid("waterfall-step-time")
    ax_k.set_gid("waterfall-tokens-per-s")
    ax_t.set_ylabel("step time (s), lower is better")
    ax_k.set_ylabel("tokens/s, higher is better")
    ax_t.set_title("From the eager baseline through each rung to the final recipe (Nx: speed-up over the baseline)",
                   fontsize=11)  # fmt: skip
    ax_k.set_xticks(range(len(bars)), [_tick(b) for b in bars], fontsize=7.5)
    kinds = [k for k in COLORS if any(bar_kind(b) == k for b in bars)]
    handles = [Patch(facecolor=COLORS[k], edgecolor="black", label=k) for k in kinds]
    if any(not b.measured for b in bars):
        handles.append(Patch(facecolor="white", edgecolor="grey", linestyle="--", label="carried, not re-timed"))
    if any(b.measured and not (b.comparable and b.same_batch) for b in bars):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch=HATCH, label="not like-for-like"))
    ax_t.legend(handles=handles, fontsize=7.5, loc="upper right", ncols=2)
    for ax in (ax_t, ax_k):
        ax.grid(axis="y", alpha=0.3)
    return fig


# ---- loss curves -----------------------------------------------------------------------------
def draw_loss(series: list[Series]):
    """Every rung's loss curve over the eager baseline (top), and each one's relative
    difference from it per step (bottom, symlog: exact equality draws at 0)."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(9, 7.5)
    ax, ax_d = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    base = next((s for s in series if s.baseline), None)
    for s in series:
        steps = list(range(1, len(s.values) + 1))
        style = dict(color="black", linewidth=2.6, zorder=1) if s.baseline else dict(linewidth=1.1, marker=".")
        ax.plot(steps, s.values, label=s.label, gid=f"loss:{s.rung}:{s.key}", **style)
        if base is not None and not s.baseline:
            n = min(len(s.values), len(base.values))
            diff = [abs(a - b) / abs(b) if b else math.inf for a, b in zip(s.values[:n], base.values[:n])]
            ax_d.plot(steps[:n], diff, label=s.label, marker=".", linewidth=1, gid=f"diff:{s.rung}:{s.key}")
    ax.set_gid("loss")
    ax_d.set_gid("loss-diff")
    ax.set_ylabel("loss")
    ax.set_title("Loss by step, every rung's run over the eager baseline (black)", fontsize=11)
    ax.legend(fontsize=7, ncols=2)
    ax_d.set_yscale("symlog", linthresh=1e-8)
    ax_d.set_ylabel("|loss - eager| / eager")
    ax_d.set_xlabel("step (a run of another length has its own lr schedule, so it leaves the baseline's curve)")
    ax_d.xaxis.set_major_locator(MaxNLocator(integer=True))
    for a in (ax, ax_d):
        a.grid(alpha=0.3)
    return fig


# ---- parity ----------------------------------------------------------------------------------
def parity_floor(p: ParityPoints) -> float:
    """Where exact agreement (0) and uncompared modules are drawn on the log axis."""
    positive = [v for v in p.rel_l2 if v is not None and v > 0 and math.isfinite(v)]
    return min(positive + [p.tolerance]) / 100


def draw_parity(p: ParityPoints):
    """rel. L2 error of each paired module's output, in native execution order, against the tolerance."""
    n = len(p.modules)
    fig = _figure(max(8.0, min(30.0, 0.15 * n + 2)), 5.5)
    ax = fig.subplots()
    floor = parity_floor(p)
    x = list(range(n))
    shown = [(i, v) for i, v in zip(x, p.rel_l2) if v is not None and v > 0 and math.isfinite(v)]
    ax.plot([i for i, _ in shown], [v for _, v in shown], marker="o", markersize=3.5, linewidth=0.8,
            label="rel. L2 error of the module's output", gid="parity-error")  # fmt: skip
    off_scale = [i for i, v in zip(x, p.rel_l2) if v is not None and not math.isfinite(v)]
    if off_scale:  # inf / nan: no place on a log axis, drawn above everything else
        top = max([v for _, v in shown] + [p.tolerance]) * 10
        ax.plot(off_scale, [top] * len(off_scale), "^", color="#d62728", linestyle="none", label="inf or nan",
                gid="parity-off-scale")  # fmt: skip
    zeros = [i for i, v in zip(x, p.rel_l2) if v == 0]
    if zeros:
        ax.plot(zeros, [floor] * len(zeros), "v", color="#2ca02c", markersize=4, linestyle="none",
                label="0: bit-identical", gid="parity-zero")  # fmt: skip
    missing = [i for i, v in zip(x, p.rel_l2) if v is None]
    if missing:
        ax.plot(missing, [floor] * len(missing), "x", color="grey", linestyle="none", label="not compared",
                gid="parity-missing")  # fmt: skip
    ax.axhline(p.tolerance, color="#d62728", linestyle="--", label=f"tolerance {p.tolerance:g}", gid="parity-tolerance")
    if p.first in p.modules:
        i = p.modules.index(p.first)
        ax.axvline(i, color="#d62728", alpha=0.4)
        ax.annotate(f"first divergence: {p.first}", (i, p.tolerance), fontsize=8, color="#d62728",
                    xytext=(4, 8), textcoords="offset points")  # fmt: skip
    ax.set_yscale("log")
    ax.set_gid("parity")
    step = max(1, math.ceil(n / 120))
    ax.set_xticks(x[::step], p.modules[::step], rotation=90, fontsize=6)
    ax.set_ylabel("rel. L2 error vs upstream")
    where = f"{p.pass_name} pass, " if p.pass_name else ""
    ax.set_title(f"Parity along the model: native vs upstream module outputs ({where}{p.status})", fontsize=11)
    ax.legend(fontsize=7.5)
    ax.grid(axis="y", alpha=0.3)
    return fig


# ---- memory ----------------------------------------------------------------------------------
def draw_memory(mem: list[MemoryBar], policy_rung: str | None, policies: list[PolicyBar], *, device: str | None):
    """Peak memory of each rung's timed runs (left); saved activations per memory policy (right)."""
    fig = _figure(max(9.0, 0.9 * len(mem) + (5 if policies else 1)), 5.5)
    if policies:
        axes = fig.subplots(1, 2, width_ratios=(max(len(mem), 1), len(policies) + 1))
    else:
        axes = [fig.subplots()]
    ax = axes[0]
    peaks = [b.peak_mem_bytes / MIB for b in mem]
    ax.bar(range(len(mem)), peaks, color="#1f77b4", gid="peak_mem_bytes")
    for i, b in enumerate(mem):
        ax.annotate(fmt_bytes(b.peak_mem_bytes), (i, peaks[i]), ha="center", va="bottom", fontsize=7.5)
    ax.set_xticks(range(len(mem)), [b.label for b in mem], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, max(peaks) * 1.15)
    what = "the process's peak resident set" if device == "cpu" else "the allocator's peak"
    ax.set_ylabel(f"peak memory (MiB; {what})")
    ax.set_title("Peak memory per run", fontsize=11)
    ax.set_gid("peak-memory")
    if policies:
        ax_p = axes[1]
        x = range(len(policies))
        device = [p.device_bytes / MIB for p in policies]
        ax_p.bar(x, device, color="#ff7f0e", label="kept on the device", gid="saved_device_bytes")
        ax_p.bar(x, [p.host_bytes / MIB for p in policies], bottom=device, color="#c5b0d5",
                 label="offloaded to host", gid="saved_host_bytes")  # fmt: skip
        total = [p.device_bytes + p.host_bytes for p in policies]
        for i, p in enumerate(policies):
            text = fmt_bytes(p.device_bytes) + (f"\n+ {fmt_bytes(p.host_bytes)} host" if p.host_bytes else "")
            ax_p.annotate(text, (i, total[i] / MIB), ha="center", va="bottom", fontsize=7.5)
        ax_p.set_ylim(0, max(total) / MIB * 1.25)
        ax_p.set_xticks(list(x), [p.policy + (" (recipe)" if p.chosen else "") for p in policies], fontsize=8)
        ax_p.set_ylabel("saved activations (MiB)")
        ax_p.set_title(f"Saved activations per memory policy ({policy_rung})", fontsize=11)
        ax_p.legend(fontsize=7.5, loc="upper center")
        ax_p.set_gid("saved-activations")
    return fig


# ---- writing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Picture:
    name: str
    """File name in the workspace (`waterfall.png`)."""
    title: str
    path: Path | None
    """None when there was nothing to draw; `why` says why."""
    why: str = ""


def write_picture(fig, path: Path) -> Path:
    atomic_write_bytes(path, png_bytes(fig))
    return path
