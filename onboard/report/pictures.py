"""The report's pictures: PNGs drawn with matplotlib's Agg canvas, from onboard.report.facts
(the waterfall: from onboard.report.steps, each rung's interleaved timing and their product; the
memory picture: from onboard.report.memory_facts, run peaks and tensor bytes per kernel apart).

Each `draw_*` takes the data those modules computed from the ledger and returns a Figure
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

from onboard.report.facts import BASELINE, Bar, ParityPoints, Series, ValSeries
from onboard.report.memory_facts import MemoryBar, PolicyBar, TensorPeaks
from onboard.report.steps import Factor, Step
from onboard.workspace.fsutil import atomic_write_bytes
from titan_core.memory.estimate import format_bytes
from onboard.ladder.gates import TIMED_APART, fmt_interval, interval_measured

DPI = 110
MIB = 2**20
COLORS = {
    "baseline": "#7f7f7f",
    "kept": "#2ca02c",
    "not kept": "#e377c2",
    "not decided": "#fdae6b",
    "final recipe": "#1f4e79",
}
HATCH = "//"


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib, only once a picture is drawn
    from matplotlib.figure import Figure  # lazy: matplotlib, only once a picture is drawn

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes; no Software/time metadata, so equal pictures are equal bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


# ---- waterfall -------------------------------------------------------------------------------
def bar_kind(bar: Bar) -> str:
    """The kind of a timed run (the report's table of timed runs)."""
    if bar.rung == "final":
        return "final recipe"
    if bar.kept is None:
        return "baseline" if bar.rung == BASELINE else "not decided"
    return "kept" if bar.kept else "not kept"


CUMULATIVE = "#a6bddb"
Y_TICKS = (0.1, 0.2, 0.25, 0.33, 0.5, 0.67, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 4, 5, 10, 20)


def _step_tick(s: Step) -> str:
    lines = textwrap.wrap(s.what, 24)
    lines = lines[:4] + (["..."] if len(lines) > 4 else [])
    return "\n".join([s.label, *lines, f"[{s.kind}]"])


def _bar_label(f: Factor, *, cumulative: bool) -> str:
    """Speed-up, interval, outcome; a product of intervals says its confidence (the union bound's). A ratio
    timed apart is context (no interval, no outcome); an interval that measured nothing, not measured."""
    if not f.protocol:
        return f"{f.speedup:.2f}x\ncontext:\ntimed apart,\nno interval"
    if not interval_measured(f.low, f.high):
        return f"{f.speedup:.2f}x\ninterval:\nnot measured"
    lines = [f"{f.speedup:.2f}x", f"({fmt_interval(f.low, f.high)})", f.outcome or ""]
    if cumulative or f.links > 1:
        lines[-1] += f"{', ' if f.outcome else ''}>= {f.confidence:.0%}"
    return "\n".join(lines)


def _floating(ax, x: int, f: Factor, color: str, gid: str) -> None:
    """A bar from 1 to the speed-up (down when slower), its interval as a whisker, its label at the end."""
    (rect,) = ax.bar([x], [f.speedup - 1], bottom=1, width=0.62, gid=gid).patches
    rect.set_facecolor(color if f.protocol else "white")
    rect.set_edgecolor("black" if f.protocol else color)
    rect.set_linewidth(1.2 if f.protocol else 1.8)
    if not f.protocol:
        rect.set_hatch(HATCH)
    measured = interval_measured(f.low, f.high)  # an interval that measured nothing gets no whisker
    if measured:
        ax.errorbar([x], [f.speedup], yerr=[[f.speedup - f.low], [f.high - f.speedup]], fmt="none", ecolor="black",
                    elinewidth=1.1, capsize=5, gid=f"{gid}-ci")  # fmt: skip
    up = f.speedup >= 1
    end = (f.high if up else f.low) if measured else f.speedup
    label = _bar_label(f, cumulative=gid.startswith("cumulative"))
    ax.annotate(label, (x, end), ha="center", va="bottom" if up else "top", fontsize=7.5, xytext=(0, 3 if up else -3),
                textcoords="offset points")  # fmt: skip


def _note(ax, x: int, text: str) -> None:
    ax.annotate(text, (x, 1), ha="center", va="bottom", fontsize=7.5, color="#555555", style="italic",
                xytext=(0, 4), textcoords="offset points")  # fmt: skip


def _ticks(bottom: float, top: float) -> list[float]:
    """Y_TICKS within the axis, 1 always, no two closer than a ninth of the axis (log scale)."""
    gap = math.log(top / bottom) / 9
    kept = [1.0]
    above, below = [t for t in Y_TICKS if 1 < t <= top], [t for t in Y_TICKS if bottom <= t < 1]
    for side in (above, below[::-1]):
        last = 1.0
        for t in side:
            if abs(math.log(t / last)) >= gap:
                kept.append(t)
                last = t
    return sorted(kept)


def _log_axis(ax, values: list[float], n: int) -> None:
    """A log axis around 1 with room for the labels above (and, when a bar goes down, below) the bars."""
    # lazy: matplotlib, only once a picture is drawn
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    lo, hi = math.log(min(values + [1.0])), math.log(max(values + [1.0]))
    span = max(hi - lo, math.log(1.3))
    bottom = math.exp(lo - (0.5 if lo < 0 else 0.1) * span)
    top = math.exp(hi + 0.6 * span)
    ax.set_yscale("log")
    ax.set_ylim(bottom, top)
    ax.set_xlim(-0.6, n - 0.4)
    ax.yaxis.set_major_locator(FixedLocator(_ticks(bottom, top)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.axhline(1, color="black", linewidth=0.8, zorder=0)
    ax.grid(axis="y", alpha=0.3)


def _ends(f: Factor | None) -> list[float]:
    if f is None:
        return []
    return [f.speedup] + ([f.low, f.high] if interval_measured(f.low, f.high) else [])


def _draw_steps(ax, steps: list[Step]) -> None:
    for i, s in enumerate(steps):
        if s.kind == "final recipe":
            continue
        if s.kind == "baseline":
            _note(ax, i, "baseline\n1.00x")
        elif s.factor is None:
            _note(ax, i, s.text)
        else:
            _floating(ax, i, s.factor, COLORS[s.kind], f"step:{s.rung}")


def _draw_cumulative(ax, steps: list[Step]) -> None:
    previous = None
    for i, s in enumerate(steps):
        final = s.kind == "final recipe"
        if s.kind == "baseline":
            _note(ax, i, "eager = 1x")
        elif s.cumulative is None:
            _note(ax, i, "no product:\na kept change\nhas no timing")
        elif final or s.cumulative != previous:  # labelled where the recipe's speed changed, and at the end
            color = COLORS["final recipe"] if final else CUMULATIVE
            _floating(ax, i, s.cumulative, color, f"cumulative:{s.rung}")
        else:  # the recipe as it was: the level carries on, unlabelled
            protocol = s.cumulative.protocol
            ax.bar([i], [s.cumulative.speedup - 1], bottom=1, width=0.62, color=CUMULATIVE if protocol else "white",
                   alpha=0.45, edgecolor=CUMULATIVE, linewidth=0, hatch=None if protocol else HATCH,
                   gid=f"cumulative:{s.rung}")  # fmt: skip
        previous = s.cumulative


def _legend(fig, steps: list[Step], conf: float | None, apart: bool) -> None:
    from matplotlib.lines import Line2D  # lazy: matplotlib, only once a picture is drawn
    from matplotlib.patches import Patch  # lazy: matplotlib, only once a picture is drawn

    kinds = [k for k in ("kept", "not kept", "not decided") if any(s.kind == k for s in steps)]
    handles = [Patch(facecolor=COLORS[k], edgecolor="black", label=k) for k in kinds]
    handles.append(Patch(facecolor=COLORS["final recipe"], edgecolor="black", label="final recipe"))
    if apart:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch=HATCH, label=TIMED_APART))
    if conf:
        handles.append(Line2D([], [], color="black", marker="_", markersize=10, label=f"{conf:.0%} interval"))
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize=8, frameon=False)


def draw_waterfall(steps: list[Step]):
    """Each rung's speed-up over the recipe before it (top) and the product of the kept ones (bottom)."""
    fig = _figure(max(8.0, 1.6 * len(steps) + 1.5), 8.6)
    ax_s, ax_c = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    timed = [s.factor for s in steps if s.kind not in ("baseline", "final recipe") and s.factor is not None]
    conf = next((f.confidence for f in timed if f.protocol and f.low is not None), None)
    apart = any(f is not None and not f.protocol for s in steps for f in (s.factor, s.cumulative))
    _draw_steps(ax_s, steps)
    _draw_cumulative(ax_c, steps)
    _log_axis(ax_s, [v for s in steps if s.kind != "final recipe" for v in _ends(s.factor)], len(steps))
    _log_axis(ax_c, [v for s in steps for v in _ends(s.cumulative)], len(steps))
    ax_s.set_gid("waterfall-steps")
    ax_c.set_gid("waterfall-cumulative")
    how = "its own interleaved timing" + (f", {conf:.0%} interval" if conf else "")
    how += f"; hatched: {TIMED_APART}" if apart else ""
    ax_s.set_title(f"Each rung: speed-up over the recipe before it ({how})", fontsize=10.5)
    ax_c.set_title("The recipe so far: the kept steps multiplied (interval: the product of theirs; its confidence "
                   "by the union bound)", fontsize=10.5)  # fmt: skip
    ax_s.set_ylabel("speed-up vs the recipe before")
    ax_c.set_ylabel("speed-up vs eager")
    ax_c.set_xticks(range(len(steps)), [_step_tick(s) for s in steps], fontsize=7.5)
    _legend(fig, steps, conf, apart)
    return fig


# ---- loss curves -----------------------------------------------------------------------------
VAL_STYLE = dict(linestyle="--", linewidth=1.0, marker="D", markersize=5, markeredgecolor="black", zorder=3)
"""A validation curve: dashed, a diamond at each step it was measured (training curves: solid)."""


def draw_loss(series: list[Series], val: list[ValSeries] = ()):
    """Every rung's loss curve over the eager baseline (top), and each one's relative
    difference from it per step (bottom, symlog: exact equality draws at 0). `val`: the held-out
    loss of the runs that validated, drawn in the top panel at the steps it was measured, each
    in the colour of its rung's training curve."""
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib, only once a picture is drawn

    fig = _figure(9, 7.5)
    ax, ax_d = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    base = next((s for s in series if s.baseline), None)
    colors = {}
    for s in series:
        steps = list(range(1, len(s.values) + 1))
        style = dict(color="black", linewidth=2.6, zorder=1) if s.baseline else dict(linewidth=1.1, marker=".")
        (line,) = ax.plot(steps, s.values, label=s.label, gid=f"loss:{s.rung}:{s.key}", **style)
        colors.setdefault(s.rung, line.get_color())
        if base is not None and not s.baseline:
            n = min(len(s.values), len(base.values))
            diff = [abs(a - b) / abs(b) if b else math.inf for a, b in zip(s.values[:n], base.values[:n])]
            ax_d.plot(steps[:n], diff, label=s.label, marker=".", linewidth=1, gid=f"diff:{s.rung}:{s.key}")
    for v in val:
        # the rung's own run shares its training curve's colour; its other runs take the next ones
        color = colors.get(v.rung) if not v.run else None
        ax.plot(v.steps, v.values, label=v.label, gid=v.gid, **({"color": color} if color else {}), **VAL_STYLE)
    ax.set_gid("loss")
    ax_d.set_gid("loss-diff")
    ax.set_ylabel("loss")
    title = "Loss by step, every rung's run over the eager baseline (black)"
    title += "; validation loss dashed, a diamond per evaluation" if val else ""
    ax.set_title(title, fontsize=11)
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
def draw_memory(mem: list[MemoryBar], policy_rung: str | None, policies: list[PolicyBar], *, device: str | None,
                tensors: TensorPeaks | None = None):  # fmt: skip
    """Peak memory of each rung's timed runs (left; on CPU the process's RSS); with `tensors`, the
    kernels rung's tensor bytes per kernel beside it (what its memory rule decides by, in its own
    unit: onboard.report.memory_facts), or why there are none; saved activations per memory policy (right)."""
    widths = [max(len(mem), 1)] + ([max(len(tensors.bars), 3)] if tensors is not None else [])
    widths += [len(policies) + 1] if policies else []
    fig = _figure(max(9.0, 0.9 * sum(widths) + 1), 5.5)
    axes = list(fig.subplots(1, len(widths), width_ratios=widths)) if len(widths) > 1 else [fig.subplots()]
    _draw_run_peaks(axes.pop(0), mem, device)
    if tensors is not None:
        _draw_tensor_peaks(axes.pop(0), tensors)
    if policies:
        _draw_policies(axes.pop(0), policy_rung, policies)
    return fig


def _draw_run_peaks(ax, mem: list[MemoryBar], device: str | None) -> None:
    peaks = [b.peak_mem_bytes / MIB for b in mem]
    ax.bar(range(len(mem)), peaks, color="#1f77b4", gid="peak_mem_bytes")
    for i, b in enumerate(mem):
        ax.annotate(format_bytes(b.peak_mem_bytes), (i, peaks[i]), ha="center", va="bottom", fontsize=7.5)
    ax.set_xticks(range(len(mem)), [b.label for b in mem], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, max(peaks) * 1.15)
    what = "the process's peak resident set (RSS)" if device == "cpu" else "the allocator's peak"
    ax.set_ylabel(f"peak memory (MiB; {what})")
    ax.set_title("Peak memory per run", fontsize=11)
    ax.set_gid("peak-memory")


def _draw_tensor_peaks(ax, t: TensorPeaks) -> None:
    """A bar per kernel choice measured; one not measured (or a ledger with none) says so, drawn as no bar."""
    ax.set_gid("tensor-peaks")
    ax.set_title("Tensor memory per kernel (kernels rung:\nwhat its memory rule decides by)", fontsize=11)
    if not t.bars:  # an older ledger: words, not a zero
        ax.text(0.5, 0.5, "\n".join(textwrap.wrap(t.why_none, 34)), ha="center", va="center", fontsize=9,
                style="italic", color="#555555", transform=ax.transAxes, gid="tensor-peaks-none")  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
        return
    shown = [(i, b) for i, b in enumerate(t.bars) if b.peak_bytes is not None]
    top = max([b.peak_bytes / MIB for _, b in shown] + [1.0])
    ax.bar([i for i, _ in shown], [b.peak_bytes / MIB for _, b in shown], color="#9467bd", gid="tensor_peak_bytes")
    for i, b in enumerate(t.bars):
        if b.peak_bytes is None:
            ax.annotate("not\nmeasured", (i, 0), ha="center", va="bottom", fontsize=7.5, style="italic",
                        color="#555555", xytext=(0, 4), textcoords="offset points")  # fmt: skip
            continue
        text = "\n".join([format_bytes(b.peak_bytes), *textwrap.wrap(b.saving_text, 12)])
        ax.annotate(text, (i, b.peak_bytes / MIB), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(t.bars)), [b.label + (" (recipe)" if b.held else "") for b in t.bars], rotation=30,
                  ha="right", fontsize=8)  # fmt: skip
    ax.set_xlim(-0.6, len(t.bars) - 0.4)  # room for a last choice that has no bar, only its words
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel(f"tensor bytes at the fp32 step's peak (MiB)\n{t.unit}", fontsize=8.5)


def _draw_policies(ax_p, policy_rung: str | None, policies: list[PolicyBar]) -> None:
    x = range(len(policies))
    device = [p.device_bytes / MIB for p in policies]
    ax_p.bar(x, device, color="#ff7f0e", label="kept on the device", gid="saved_device_bytes")
    ax_p.bar(x, [p.host_bytes / MIB for p in policies], bottom=device, color="#c5b0d5",
             label="offloaded to host", gid="saved_host_bytes")  # fmt: skip
    total = [p.device_bytes + p.host_bytes for p in policies]
    for i, p in enumerate(policies):
        text = format_bytes(p.device_bytes) + (f"\n+ {format_bytes(p.host_bytes)} host" if p.host_bytes else "")
        ax_p.annotate(text, (i, total[i] / MIB), ha="center", va="bottom", fontsize=7.5)
    ax_p.set_ylim(0, max(total) / MIB * 1.25)
    ax_p.set_xticks(list(x), [p.policy + (" (recipe)" if p.chosen else "") for p in policies], fontsize=8)
    ax_p.set_ylabel("saved activations (MiB)")
    ax_p.set_title(f"Saved activations per memory policy ({policy_rung})", fontsize=11)
    ax_p.legend(fontsize=7.5, loc="upper center")
    ax_p.set_gid("saved-activations")


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
