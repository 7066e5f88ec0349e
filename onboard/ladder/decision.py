"""One record for every keep/choose decision a rung takes, and the one rule that takes it (DESIGN section 7).

A rung that decides a recipe lever times whole training steps of the recipe as it stands (the
*holder*) against the recipe with the lever changed (the *candidate*), interleaved
(`titan_core.measure.timing.compare`). `decide` keeps the candidate only when the comparison says
`faster`, an interval wholly on its side, which also rules out whatever earlier decision put the
holder there (the record names the rung it reverses); `decide_memory` compares measured peaks with
a margin. The rung stores each `Decision.to_dict()` under its details' `decisions`; `status` and
REPORT.md print its headline (`headline`), so the figure a person reads is the figure that decided.
Light on purpose: no torch, no titan_core import (status and the report read it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from onboard.ladder.gates import fmt_interval, interval_measured

KEPT = "kept"
"""The candidate was faster (or saved the memory the rule asks): the recipe now holds it."""
HELD = "held"
"""The candidate was slower (or saved too little): the holder stands."""
INDISTINGUISHABLE = "indistinguishable"
"""The interval does not separate them: the holder stands."""
NOT_MEASURED = "not measured"
"""No figure that can decide (an interval that is not finite or not interleaved, a timing budget
spent, a peak not measured): the holder stands and the record says why. A loaded machine is not
one: both sides' interleaved rounds share the load, and the record keeps it beside the figure."""
NOT_ELIGIBLE = "not eligible"
"""The candidate failed a correctness check before any timing: the holder stands."""


@dataclass
class Decision:
    """What one rung decided about one lever, with the figure it decided by."""

    rung: str
    lever: str
    """The recipe key the decision is about ("training.mixed_precision_param", "kernels.attention",
    "execution_mode" for compile.enable / graph_trainer.enable together)."""
    holder: Any
    """The value the recipe held when the rung started."""
    candidate: Any
    """The value timed against it."""
    value: Any
    """The value the recipe holds after the rung (the candidate only when `verdict` is kept)."""
    verdict: str
    """One of KEPT, HELD, INDISTINGUISHABLE, NOT_MEASURED, NOT_ELIGIBLE."""
    figure: str
    """What decided: "speed" (interleaved whole steps), "memory" (measured peaks), or "none"."""
    why: str
    """One line a person reads: the figure, its interval, and the rule that applied."""
    speedup: float | None = None
    """Holder time / candidate time (above 1: the candidate is faster), the comparison's estimate."""
    ci: list[float] | None = None
    """[low, high] of `speedup` at `confidence`; None when no interval was had."""
    confidence: float | None = None
    rounds: int | None = None
    outcome: str | None = None
    """The timing protocol's outcome for the candidate against the holder."""
    memory_saving: float | None = None
    """1 - candidate peak / holder peak, when both peaks were measured."""
    load: dict[str, Any] = field(default_factory=dict)
    """The machine's load around the timing (load_before, load_after, foreign_cores, load_note) as the
    comparison recorded it: beside the figure, never instead of it (titan_core.measure.timing)."""
    reverses: str | None = None
    """When the holder was put there by an earlier rung and this decision replaced it: that rung's name."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite_interval(cmp: dict) -> bool:
    """An interval that can decide: paired (interleaved rounds; two runs timed apart never decide), finite,
    positive, and not so wide it says nothing (gates.interval_measured)."""
    if cmp.get("paired") is False:
        return False
    return all(isinstance(cmp.get(k), (int, float)) and math.isfinite(cmp[k]) and cmp[k] > 0
               for k in ("ratio", "ci_low", "ci_high")) and interval_measured(cmp["ci_low"], cmp["ci_high"])  # fmt: skip


def speed_figure(cmp: dict) -> tuple[float | None, list[float] | None]:
    """(speedup, [low, high]) of a Comparison.to_dict() of candidate against holder; Nones when not finite."""
    if not _finite_interval(cmp):
        return None, None
    return 1.0 / cmp["ratio"], [1.0 / cmp["ci_high"], 1.0 / cmp["ci_low"]]


def outcome_of(cmp: dict) -> str:
    """The comparison's outcome, with a non-finite interval read as not measured whatever it says."""
    if not _finite_interval(cmp):
        return NOT_MEASURED
    return cmp.get("outcome") or NOT_MEASURED


def decide(rung: str, lever: str, *, holder: Any, candidate: Any, comparison: dict, set_by: str | None = None,
           what: str = "") -> Decision:  # fmt: skip
    """The decision of one timed lever: `comparison` is Comparison.to_dict() of the candidate's whole
    steps against the holder's. `set_by`: the rung that put the holder in the recipe, if any (a
    reversal names it). `what`: a short name for the lever in the line a person reads."""
    what = what or f"{lever}={candidate}"
    outcome = outcome_of(comparison)
    speedup, ci = speed_figure(comparison)
    figure = f"{speedup:.2f}x ({fmt_interval(*ci)})" if speedup is not None else "no finite interval"
    if outcome == "faster":
        verdict, value = KEPT, candidate
        why = f"{what} is faster than {lever}={holder}: {figure}"
    elif outcome == "slower":
        verdict, value = HELD, holder
        why = f"{what} is slower than {lever}={holder}: {figure}; {holder} stands"
    elif outcome == INDISTINGUISHABLE:
        verdict, value = INDISTINGUISHABLE, holder
        why = f"{what} and {lever}={holder} are indistinguishable: {figure}; {holder} stands"
    else:
        verdict, value = NOT_MEASURED, holder
        reason = comparison.get("not_measured_why") or "no finite interval narrow enough to decide"
        why = f"{what} against {lever}={holder} was not measured ({reason}); {holder} stands"
    if comparison.get("load_note") and verdict != NOT_MEASURED:
        # interleaved rounds shared the load, so it decided; the person reads what the machine was doing
        why += f" (timed while {comparison['load_note'].split(':')[0]})"
    reverses = set_by if verdict == KEPT and set_by and set_by != rung else None
    if reverses:
        why += f"; this reverses the {reverses} rung's {lever}={holder}, its interval ruled out by this one"
    return Decision(
        rung=rung, lever=lever, holder=holder, candidate=candidate, value=value, verdict=verdict, figure="speed",
        why=why, speedup=speedup, ci=ci, confidence=comparison.get("confidence"), rounds=comparison.get("rounds"),
        outcome=outcome, reverses=reverses,
        load={k: comparison.get(k) for k in ("load_before", "load_after", "foreign_cores", "load_note") if k in comparison},
    )  # fmt: skip


def decide_memory(rung: str, lever: str, *, holder: Any, candidate: Any, peak_holder: int | None,
                  peak_candidate: int | None, min_saving: float, margin: float, holder_earned: bool = False,
                  what: str = "") -> Decision:  # fmt: skip
    """A memory rule with a margin: the candidate takes the lever when it saves at least
    `min_saving + margin` of the holder's peak (a fraction); when the holder itself was earned by
    saving memory (`holder_earned`, the candidate being the plain path it replaced) it is dropped
    only when it no longer saves `min_saving - margin`, i.e. the candidate's saving is above
    `-(min_saving - margin)`. A saving between the two edges leaves the holder standing, so a
    figure at the edge cannot flip between attempts. A peak that was not measured never decides."""
    what = what or f"{lever}={candidate}"
    if not peak_holder or peak_candidate is None or peak_holder <= 0:
        return Decision(rung=rung, lever=lever, holder=holder, candidate=candidate, value=holder,
                        verdict=NOT_MEASURED, figure="memory",
                        why=f"peak memory of {what} against {lever}={holder} was not measured; {holder} stands")  # fmt: skip
    saving = 1 - peak_candidate / peak_holder
    edge = round(saving, 9)  # a saving of exactly the edge (0.12 against 0.10 + 0.02) is at it, not below
    if holder_earned:
        keep = edge > -round(min_saving - margin, 9)
        rule = f"the holder is dropped once it saves less than {min_saving - margin:.0%}"
    else:
        keep = edge >= round(min_saving + margin, 9)
        rule = f"needs >= {min_saving + margin:.0%} ({min_saving:.0%} + margin {margin:.0%})"
    verdict, value = (KEPT, candidate) if keep else (HELD, holder)
    said = f"{saving:.1%} less peak memory" if saving >= 0 else f"{-saving:.1%} more peak memory"
    why = f"{what}: {said} than {lever}={holder} ({rule}); {'kept' if keep else f'{holder} stands'}"
    return Decision(rung=rung, lever=lever, holder=holder, candidate=candidate, value=value, verdict=verdict,
                    figure="memory", why=why, memory_saving=saving)  # fmt: skip


def headline(decisions: list[dict]) -> str:
    """The figures a rung's decisions rest on, as `status` and REPORT.md print them, e.g.
    "compile: 1.48x (1.31-1.67) kept; kernels.attention=tokamax: 0.91x (0.85-0.97) held"; a decision
    taken without timing (figure "none") says "untimed", one whose timing failed "not measured"."""
    parts = []
    for d in decisions or ():
        name = d["lever"] if d["lever"] == "execution_mode" else f"{d['lever']}={d['candidate']}"
        if d.get("figure") == "speed" and d.get("speedup") is not None and d.get("ci") and interval_measured(*d["ci"]):
            fig = f"{d['speedup']:.2f}x ({fmt_interval(*d['ci'])})"
        elif d.get("figure") == "memory" and d.get("memory_saving") is not None:
            fig = f"{d['memory_saving']:.0%} memory saved"
        elif d.get("figure") == "none":  # decided without timing (a correctness check, an unusable holder)
            fig = "untimed"
        else:
            fig = "not measured"
        said = fig if fig == d["verdict"] else f"{fig} {d['verdict']}"  # "not measured", not twice
        parts.append(f"{name} {d['candidate'] if d['lever'] == 'execution_mode' else ''}".strip() + f": {said}")
    return "; ".join(parts)


def holder_set_by(ledger, key: str) -> str | None:
    """The rung whose passed attempt last wrote `key` into the recipe (its recorded recipe edit), or None
    when no rung did (a fresh recipe's default, or the person's own value). `ledger`: the workspace's
    Ledger (`ctx.workspace.ledger`)."""
    rung = None
    for entry in ledger.attempts:
        for edit in (entry.recipe_edit or {}).get("edits", []) if entry.status == "passed" else ():
            if isinstance(edit, dict) and edit.get("key") == key:
                rung = entry.rung
    return rung


DECISION_KEYS = ("rung", "lever", "holder", "candidate", "value", "verdict", "figure")
"""What a Decision record must hold to be shown (a hand edit may have dropped some)."""


def decision_records(details: dict) -> list[dict]:
    """The Decision records (decision.Decision.to_dict) in a rung's `details.decisions`; [] when it
    has none, or an older ledger's other shape there; a record a hand edit broke is left out."""
    found = details.get("decisions") if isinstance(details, dict) else None
    if not isinstance(found, list):
        return []
    return [d for d in found if isinstance(d, dict) and all(k in d for k in DECISION_KEYS)]
