"""The speed part of REPORT.md: the summary's decisions and step-time table, and the waterfall's
numbers in words.

Two kinds of number, never mixed: the figures the rungs decided by (each candidate timed
interleaved against the recipe it would change, with an interval: onboard.ladder.decision, and
the waterfall's onboard.report.steps), and the step times of runs timed apart: context, labelled
so (gates.TIMED_APART), with no interval and no faster / slower. Only the first is ever bold: the
summary's headline is the kept decisions' figures (`decision_lines`), in the very text `onboard
status` prints (decision.headline). Every interval is printed through gates.fmt_interval.
"""

from __future__ import annotations

from onboard.report.facts import TIMED, Bar, Record, decision_name
from onboard.report.pictures import bar_kind
from onboard.report.steps import NOT_MEASURED, Factor, Step, step_text
from onboard.report.html import table
from onboard.ladder.decision import KEPT, headline
from onboard.ladder.gates import TIMED_APART, fmt_interval, fmt_seconds, interval_measured
from titan_core.memory.estimate import format_bytes


APART_NOTE = (
    "The step times above are two runs timed minutes apart: on a shared machine load moves them as much as a "
    "change can, so their ratio is not a decision. What the ladder kept was decided by the interleaved "
    "figures at the top of this summary, which the waterfall shows."
)


WATERFALL_TEXT = (
    "The waterfall (top): each rung's speed-up over the recipe before it, as the rung's own interleaved timing "
    "measured it (the two candidates' steps alternated, so the machine's load falls on both), with its interval "
    "and outcome; for a rung that recorded decisions, its kept decisions' figures (those of the summary). "
    "Bottom: the speed-ups the ladder kept, multiplied along; the interval is the product of "
    "theirs, and by the union bound it holds with at least the confidence shown (1 minus the sum of the "
    f"intervals' miss rates), if the changes compose. Hatched bars, *{TIMED_APART}*, are the ratio of "
    "two runs timed minutes apart (no interleaved record in the ledger): nothing bounds them, so they carry no "
    "interval and no outcome, and a product with one of them has none either."
)


def _tokens(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:,.0f}"


def _like(b: Bar) -> str:
    if not b.measured:
        return "carried"
    return "yes" if b.comparable and b.same_batch else "**no**"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else ""


def _apart(ratio: str) -> str:
    return f"{ratio} {TIMED_APART}, not a decision" if ratio else ""


def factor_cell(f: Factor | None, kind: str = "", *, bold: bool = False) -> str:
    """A speed-up with its interval and outcome, or what stands instead of one (`kind`: the step's)."""
    if f is None:
        return step_text(None, kind)
    if f.links == 0 and f.protocol:
        return "baseline (1x)" if kind == "baseline" else "1x (the baseline's)"
    x = f"**{f.speedup:.2f}x**" if bold else f"{f.speedup:.2f}x"
    if not f.protocol:
        return f"{x} {TIMED_APART}"
    if not interval_measured(f.low, f.high):  # none kept, or a product of intervals too wide to say anything
        return f"{x} ({NOT_MEASURED})"
    conf = f"{f.confidence:.0%}" if f.links < 2 else f">= {f.confidence:.0%} by the union bound"
    return f"{x} ({fmt_interval(f.low, f.high)}, {conf}) {f.outcome}"


def _protocol_row(steps: list[Step]) -> list[str]:
    final = steps[-1].cumulative if steps else None
    kept = [s.label for s in steps if s.kind == "kept"]
    name = "kept figures multiplied"
    if final is None:
        return [name, "", "", "not known: a kept change has no timing recorded"]
    what = f"the kept rungs' speed-ups multiplied, if the changes compose ({', '.join(kept)})" if kept else (
        "no rung kept a change")  # fmt: skip
    return [name, "1x", "", f"{factor_cell(final)}: {what}"]


def decision_figure(d: dict) -> str:
    """The figure a Decision rests on, as decision.headline writes it (so the summary and `status` agree)."""
    return headline([d]).rsplit(": ", 1)[1].rsplit(" ", 1)[0]


def kept_decisions(recs: list[Record]) -> list[tuple[Record, dict]]:
    """(rung record, Decision) of every kept decision of a rung whose latest entry stands (passed or stale)."""
    return [(r, d) for r in recs if r.status in TIMED for d in r.decisions if d["verdict"] == KEPT]


def decision_lines(recs: list[Record]) -> list[str]:
    """The summary's headline: each kept decision with the figure that decided it, in bold."""
    kept = kept_decisions(recs)
    if not kept:
        if any(r.decisions for r in recs if r.status in TIMED):
            return ["**No rung kept a change**: each candidate was timed against the recipe it would change, and "
                    "the recipe holds what it held (each rung's decisions are in its section below).", ""]  # fmt: skip
        return ["Decisions: none recorded yet (no keep/choose rung has passed, or the ledger predates decision "
                "records).", ""]  # fmt: skip
    lines = ["What the ladder kept, each by the figure that decided it (the change timed interleaved against the "
             "recipe it would change; speed-up with its interval):", ""]  # fmt: skip
    for rec, d in kept:
        stale = " (stale)" if rec.status != "passed" else ""
        if d.get("figure") == "speed" and d.get("ci") and isinstance(d.get("confidence"), float):
            rounds = f", {d['rounds']} interleaved rounds" if isinstance(d.get("rounds"), int) else ""
            how = f" kept ({d['confidence']:.0%} interval{rounds})"
        elif d.get("figure") == "memory":
            how = " kept (measured peaks)"
        else:
            how = f" kept, untimed: {d['why']}"
        lines.append(f"- {rec.rung}{stale}: {decision_name(d)}: **{decision_figure(d)}**{how}")
    return lines + [""]


def speed_table(bars: list[Bar], facts: dict, cpu: bool, steps: list[Step]) -> list[str]:
    b, f = bars[0], bars[-1]
    timed = f"{f.source} rung" + ("" if f.measured else ", carried: the final recipe was not timed as a whole")
    mfu = [f"{x.mfu:.1%}" if x.mfu is not None else "not recorded" for x in (b, f)]
    rows = [
        ["step time", fmt_seconds(b.step_time_s), fmt_seconds(f.step_time_s),
         _apart(f"{facts['speedup']:.2f}x") if "speedup" in facts else ""],  # fmt: skip
        ["tokens/s", _tokens(b.tokens_per_s), _tokens(f.tokens_per_s), _apart(_ratio(f.tokens_per_s, b.tokens_per_s))],
        ["MFU", *mfu, "on CPU against the matmul peak measured here: indicative" if cpu else ""],
        [
            "peak memory",
            *(format_bytes(x.peak_mem_bytes, missing="not recorded") for x in (b, f)),
            _ratio(f.peak_mem_bytes, b.peak_mem_bytes) + (" (the process's peak resident set)" if cpu else ""),
        ],
        _protocol_row(steps),
    ]
    lines = table(["", "eager baseline", f"final recipe ({timed})", ""], rows) + ["", APART_NOTE, ""]
    odd = facts["not_like_for_like"]
    if odd:
        listed = "; ".join(f"**{x['label']}** ({x['setting']})" for x in odd)
        lines += [f"Not like-for-like with the baseline (in the table of timed runs below): {listed}.", ""]
    return lines


def waterfall_lines(bars: list[Bar], steps: list[Step]) -> list[str]:
    """The numbers the waterfall draws, in words (for a reader, or an agent, without the picture), then the
    timed runs' own step times, which the picture does not draw."""
    headers = ["#", "bar", "timed", "kept", "speed-up vs the recipe before", "how", "from", "recipe so far"]
    rows = [
        [
            i,
            s.label,
            s.what,
            s.kind,
            factor_cell(s.factor, s.kind),
            s.factor.how if s.factor else "",
            s.source,
            factor_cell(s.cumulative, "final recipe"),
        ]
        for i, s in enumerate(steps)
    ]
    lines = [WATERFALL_TEXT, "", *table(headers, rows), ""]
    lines += [
        "Each rung's own run (timed apart from the others: these step times are not what the ladder decided by):",
        "",
    ]
    headers = ["#", "run", "change", "kept", "step time", "tokens/s", "timed as", "like-for-like", "from"]
    rows = [
        [
            i,
            b.label,
            b.change,
            bar_kind(b),
            fmt_seconds(b.step_time_s),
            _tokens(b.tokens_per_s),
            b.setting,
            _like(b),
            b.source + ("" if b.measured else " (carried)"),
        ]
        for i, b in enumerate(bars)
    ]
    return lines + table(headers, rows) + [""]
