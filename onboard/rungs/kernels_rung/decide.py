"""The kernels rung's keep rule: per kernels field (loss, attention, moe, float8), the value the
recipe holds after the rung. Not a rung (no RUNG); loads no torch (the rung imports it at load).

The *holder* is the field's value in the recipe. Every other value of the field that passed the
fp32 comparison (float8: its own bound against the bf16 recipe, kernels_float8) and the
execution-mode check is a *candidate*, the plain path
(kernel_compare.REFERENCE) among them when the holder is a kernel; the holder is never timed
against itself. Each candidate's whole training steps are timed against the holder's
(`Timer`: kernels_steps.WholeSteps.compare) and decided by `decision.decide`; its peak memory
against the holder's, both measured the same way (`Peak`: kernel_compare.step_peak), by
`decision.decide_memory` with the checklist's margin. A candidate takes the field when its speed
decision is kept, or its memory decision is kept and its whole steps were measured not slower
(`faster` or `indistinguishable`: a step whose speed went unmeasured does not get in on memory).
A speed win does not take the field when the candidate's peak is so much higher that the holder
saves `min_saving` of it (`memory_cost`): the memory rule would hand the field back on the next
attempt (at min_saving + margin), and the ladder would swap the two for ever on noise. The margin
between the two edges keeps a peak measured a little differently from flipping either rule.
`indistinguishable` and `not measured` leave the holder, so a re-run on noise never flips a field
and two rungs cannot send the ladder round and round. Several candidates that take it: the simplest
holds it, and a later one takes it only by being `faster` head to head, by the same rule.

A holder that is wrong (fails the fp32 comparison), does not run in the recipe's mode, raised, or
does not apply here gives the field to the plain path for that reason, not by timing; the other
candidates are then timed against the plain path.

Once a field's value is known its decisions are settled (`_settle`): `kept` stays only on the
decisions of the value the recipe holds, and every decision's `value` is that value, so no line
says "kept" of a value the recipe does not hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from onboard.rungs import gate_recipe
from onboard.ladder.contract import RecipeEdit
from onboard.ladder.decision import (
    HELD,
    INDISTINGUISHABLE,
    KEPT,
    NOT_ELIGIBLE,
    NOT_MEASURED,
    Decision,
    decide,
    decide_memory,
    holder_set_by,
)  # fmt: skip

RUNG_NAME = "kernels"
"""The rung every decision here is recorded under."""

Timer = Callable[[str, str, str], dict]
"""(field, candidate, against) -> Comparison.to_dict() of the candidate's whole steps against
`against`'s, with "describe"; raises when a side cannot build or step (kernels_steps.StepsRaised)."""
Peak = Callable[[str, str], "tuple[int | None, str | None]"]
"""(field, value) -> (peak bytes, None), or (None, why it was not measured)."""
ERRORS = ("loss_rel_err", "logits_rel_err", "max_grad_rel_err")
NOT_SLOWER = ("faster", INDISTINGUISHABLE)
"""Speed outcomes under which a memory decision may take the field."""


@dataclass(frozen=True)
class MemoryRule:
    """The memory rule's thresholds, as fractions of the holder's peak (checklist params)."""

    min_saving: float
    """params.min_memory_saving_percent / 100."""
    margin: float
    """params.memory_margin_percent / 100: the band around min_saving inside which the holder stands."""

    @classmethod
    def of_checklist(cls) -> "MemoryRule":
        pct, margin = (gate_recipe.param(RUNG_NAME, k) for k in ("min_memory_saving_percent", "memory_margin_percent"))
        return cls(pct / 100, margin / 100)


@dataclass
class FieldInput:
    """What the keep rule knows of one kernels field before any timing."""

    field: str
    holder: str
    """The recipe's value."""
    reference: str
    """The field's plain path (kernel_compare.REFERENCE)."""
    rows: dict[str, dict]
    """{choice: the rung's per-flag row} of the field's kernels, simplest first (KERNEL_FLAGS order)."""
    plain_runs: str | None = None
    """None when the plain path runs in the recipe's execution mode, else why not (no candidate then)."""
    set_by: str | None = None
    """The rung whose passed attempt put the holder in the recipe (decision.holder_set_by)."""
    earned_by_memory: bool = False
    """That attempt kept the holder for the memory it saved: the plain path takes the field back only
    once the holder no longer saves min_saving - margin (decide_memory's holder_earned)."""


@dataclass
class FieldChoice:
    """What the rule chose for one field, and every decision and timing it rests on."""

    field: str
    was: str
    value: str
    why: str = ""
    decisions: list[Decision] = field(default_factory=list)
    timed: dict[str, dict] = field(default_factory=dict)
    """{candidate: {"against", "timing", "peak", "against_peak", "memory_saving"}} of each candidate
    timed against the holder (the plain path, when the holder was unusable)."""
    contests: list[dict] = field(default_factory=list)
    """Every timed pair: {"challenger", "holder", "won" (faster), "timing", "describe"}; the candidates
    against the holder first, then the head-to-head contests between candidates that took the field."""
    errors: dict[str, str] = field(default_factory=dict)
    """{value: why its whole steps could not be timed}."""
    notes: list[str] = field(default_factory=list)

    @property
    def edit(self) -> bool:
        return self.value != self.was

    def to_dict(self) -> dict:
        out = {"value": self.value, "was": self.was, "edit": self.edit, "why": self.why, "contests": self.contests}
        if self.errors:
            out["errors"] = self.errors
        if self.notes:
            out["notes"] = self.notes
        return out


def eligible(row: dict | None) -> bool:
    """The kernel matched its plain path in fp32 and runs in the recipe's execution mode: it may be timed."""
    return bool(row) and row.get("status") == "compared" and bool(row.get("eligible"))


def unusable(row: dict | None) -> str | None:
    """Why the kernel of `row` cannot be held whatever its speed, or None."""
    if row is None or eligible(row):
        return None
    if row.get("status") == "not_applicable":
        return f"does not apply here ({row.get('reason')})"
    if row.get("status") == "raised":
        return f"raised ({row.get('error')})"
    if not row.get("passed"):  # a precision change (float8) says which of its own bounds it left
        return row.get("failed_why") or "does not equal the plain path in fp32 within the checklist's tolerance"
    return row.get("reason") or "does not run in the recipe's execution mode"


def max_rel_err(row: dict) -> float:
    return max((math.inf if math.isnan(row[n]) else row[n] for n in ERRORS if n in row), default=math.inf)


def earned_by_memory(ledger, lever: str, holder: str) -> bool:
    """Whether the passed attempt that last wrote `lever` = `holder` into the recipe kept it for the
    memory it saved (its recorded memory decision was kept)."""
    last = None
    for entry in ledger.attempts:
        edits = (entry.recipe_edit or {}).get("edits", []) if entry.status == "passed" else ()
        for e in edits:
            if isinstance(e, dict) and e.get("key") == lever:
                last = entry if e.get("value") == holder else None
    if last is None:
        return False
    recorded = (last.details or {}).get("decisions")
    if isinstance(recorded, dict):  # a ledger from before the Decision record: the field's reason said so
        old = recorded.get(lever.removeprefix("kernels.")) or {}
        return old.get("value") == holder and "saves >=" in str(old.get("why", ""))
    return any(isinstance(d, dict) and (d.get("lever"), d.get("candidate"), d.get("verdict"), d.get("figure"))
               == (lever, holder, KEPT, "memory") for d in recorded or ())  # fmt: skip


def field_input(field_name: str, holder: str, reference: str, rows: dict[str, dict], *, ledger,
                plain_runs: Callable[[str], str | None]) -> FieldInput:  # fmt: skip
    """The FieldInput of one field: its rows, and what the ledger says of who put the holder there."""
    lever = f"kernels.{field_name}"
    return FieldInput(
        field=field_name, holder=holder, reference=reference, rows=rows,
        plain_runs=plain_runs(field_name) if holder != reference else None,
        set_by=holder_set_by(ledger, lever), earned_by_memory=earned_by_memory(ledger, lever, holder),
    )  # fmt: skip


def field_inputs(rows: dict[str, dict], current, references: dict[str, str], *, ledger,
                 plain_runs: Callable[[str], str | None]) -> list[FieldInput]:  # fmt: skip
    """A FieldInput per field of `references` ({field: plain path}) from the rung's per-flag rows;
    `current`: the recipe's Kernels section (the holders)."""
    by_field: dict[str, dict[str, dict]] = {f: {} for f in references}
    for flag, row in rows.items():
        field_name, choice = flag.removeprefix("kernels.").split("=")
        by_field.setdefault(field_name, {})[choice] = row
    return [field_input(f, getattr(current, f), ref, by_field[f], ledger=ledger, plain_runs=plain_runs)
            for f, ref in references.items()]  # fmt: skip


def decide_field(inp: FieldInput, *, time: Timer, peak: Peak, rule: MemoryRule) -> FieldChoice:
    """The value of one field (module docstring), with its decisions settled."""
    lever, ref, holder = f"kernels.{inp.field}", inp.reference, inp.holder
    out = FieldChoice(field=inp.field, was=holder, value=holder)
    base, set_by = holder, inp.set_by
    wrong = unusable(inp.rows.get(holder)) if holder != ref else None
    if wrong and inp.plain_runs is None:
        out.decisions.append(Decision(
            rung=RUNG_NAME, lever=lever, holder=holder, candidate=ref, value=ref, verdict=KEPT, figure="none",
            why=f"the recipe's {lever}={holder} {wrong}: the plain path {ref} replaces it for that reason, not by timing",
        ))  # fmt: skip
        base, set_by = ref, None
    elif wrong:
        out.notes.append(f"the recipe's {holder} {wrong}, but the plain path cannot run here ({inp.plain_runs}): it stays")
    for choice, row in inp.rows.items():
        if choice != holder and row.get("status") in ("compared", "raised") and not eligible(row):
            out.decisions.append(Decision(rung=RUNG_NAME, lever=lever, holder=base, candidate=choice, value=base,
                                          verdict=NOT_ELIGIBLE, figure="none",
                                          why=f"{lever}={choice} {unusable(row)}: never timed; {base} stands"))  # fmt: skip
    plain = [ref] if base != ref and inp.plain_runs is None else []
    winners, outcomes = [], {}
    for cand in plain + [c for c, r in inp.rows.items() if c != base and eligible(r)]:
        earned = cand == ref and base == holder and inp.earned_by_memory
        speed, memory = _against(inp, out, cand, base, set_by, earned, time, peak, rule)
        if speed is None:
            continue
        outcomes[cand] = speed.outcome
        if speed.verdict == KEPT or (memory.verdict == KEPT and speed.outcome in NOT_SLOWER):
            winners.append(cand)
    value = winners[0] if winners else base
    for challenger in winners[1:]:
        try:
            cmp = time(inp.field, challenger, value)
        except Exception as e:  # noqa: BLE001 -- the contest is not measured; the simpler winner holds
            out.errors[getattr(e, "value", challenger)] = str(e)
            continue
        out.contests.append(_contest(challenger, value, cmp))
        d = decide(RUNG_NAME, lever, holder=value, candidate=challenger, comparison=cmp,
                   what=f"{lever}={challenger}, head to head,")  # fmt: skip
        memory_cost(d, value, _known_peak(out, value), _known_peak(out, challenger), rule)
        out.decisions.append(d)
        value = challenger if d.verdict == KEPT else value
    out.value = value
    _settle(out, lever, base, outcomes, set_by)
    out.why = "kernels rung: " + _why(inp, out, base)
    return out


def _contest(challenger: str, holder: str, cmp: dict) -> dict:
    return {"challenger": challenger, "holder": holder, "won": cmp.get("outcome") == "faster", "timing": cmp,
            "describe": cmp.get("describe", "")}  # fmt: skip


def _against(inp, out, cand, base, set_by, earned, time, peak, rule) -> tuple[Decision | None, Decision | None]:
    """(speed, memory) decisions of `cand` against `base`; (None, None) when its steps could not be timed."""
    lever = f"kernels.{inp.field}"
    try:
        cmp = time(inp.field, cand, base)
    except Exception as e:  # noqa: BLE001 -- recorded; the rung fails the kernel whose steps raised
        out.errors[getattr(e, "value", cand)] = str(e)  # kernels_steps.StepsRaised names the side that raised
        out.decisions.append(Decision(rung=RUNG_NAME, lever=lever, holder=base, candidate=cand, value=base,
                                      verdict=NOT_MEASURED, figure="speed",
                                      why=f"{lever}={cand} against {lever}={base} was not measured ({e}); {base} stands"))  # fmt: skip
        return None, None
    out.contests.append(_contest(cand, base, cmp))
    speed = decide(RUNG_NAME, lever, holder=base, candidate=cand, comparison=cmp, set_by=set_by)
    (pc, why_c), (pb, why_b) = _peak(peak, inp.field, cand), _peak(peak, inp.field, base)
    memory_cost(speed, base, pb, pc, rule)
    memory = decide_memory(RUNG_NAME, lever, holder=base, candidate=cand, peak_holder=pb, peak_candidate=pc,
                           min_saving=rule.min_saving, margin=rule.margin, holder_earned=earned)  # fmt: skip
    if memory.verdict == NOT_MEASURED and (why_c or why_b):
        memory.why = memory.why.replace(" was not measured;", f" was not measured ({why_c or why_b});")
    out.decisions += [speed, memory]
    out.timed[cand] = {"against": base, "timing": cmp, "peak": pc, "against_peak": pb,
                       "memory_saving": memory.memory_saving}  # fmt: skip
    return speed, memory


def memory_cost(speed: Decision, holder: str, peak_holder: int | None, peak_candidate: int | None,
                rule: MemoryRule) -> None:  # fmt: skip
    """Turn a kept speed decision into held when the candidate costs so much memory that the holder
    saves `rule.min_saving` of the candidate's peak (module docstring); unmeasured peaks leave it."""
    if speed.verdict != KEPT or not peak_holder or not peak_candidate:
        return
    back = 1 - peak_holder / peak_candidate
    if round(back, 9) < round(rule.min_saving, 9):
        return
    speed.verdict, speed.value, speed.reverses = HELD, holder, None
    speed.why = (speed.why.split("; this reverses")[0] + f", but it needs {peak_candidate / peak_holder - 1:.0%} more "
                 f"peak memory: {holder} saves {back:.0%} of its peak, at least the memory rule's {rule.min_saving:.0%}, "
                 f"so the memory rule would take the field back; {holder} stands")  # fmt: skip


def _known_peak(out: FieldChoice, value: str) -> int | None:
    """The peak of `value` as the timings against the holder measured it (None when unmeasured)."""
    for cand, t in out.timed.items():
        if cand == value:
            return t["peak"]
        if t["against"] == value:
            return t["against_peak"]
    return None


def _peak(peak: Peak, field_name: str, value: str) -> tuple[int | None, str | None]:
    try:
        return peak(field_name, value)
    except Exception as e:  # noqa: BLE001 -- a peak that could not be had is not measured, and says why
        return None, f"its peak raised {type(e).__name__}: {e}"


def _settle(out: FieldChoice, lever: str, base: str, outcomes: dict[str, str], set_by: str | None) -> None:
    """Every decision's value is the field's value; `kept` stays only on the value the recipe holds."""
    value = out.value
    for d in out.decisions:
        if d.verdict == KEPT and d.candidate != value:
            why = d.why.split("; this reverses")[0].removesuffix("; kept")
            if value == d.holder:
                how = outcomes.get(d.candidate, NOT_MEASURED)
                known = "" if how == "slower" else ", so not known to be no slower"
                why += f"; not taken: its whole steps were {how}{known}; {value} stands"
            else:
                why += f"; not taken: {lever}={value} took the field"
            d.verdict, d.why, d.reverses = HELD, why, None
        elif d.verdict != KEPT and d.holder != value and d.why.endswith(f"; {d.holder} stands"):
            rest = "taken on its other figure" if d.candidate == value else f"the recipe takes {lever}={value}"
            d.why = d.why.removesuffix(f"; {d.holder} stands") + f"; {rest}"
        d.value = value
    if set_by and value != out.was:
        for d in out.decisions:
            if d.verdict == KEPT and d.holder == out.was and d.reverses is None:
                d.reverses = set_by
                earlier = "an earlier attempt of this rung" if set_by == RUNG_NAME else f"the {set_by} rung"
                d.why += f"; this reverses {earlier}, which put {lever}={out.was} there"


def _why(inp: FieldInput, out: FieldChoice, base: str) -> str:
    """One line: why the field holds its value (the recipe edit's comment when it changed)."""
    value, ref = out.value, inp.reference
    if value != out.was:
        taken = "; ".join(d.why for d in out.decisions if d.verdict == KEPT)
        row = inp.rows.get(value)
        matches = ""
        if value != ref and row:  # a float8 recipe is within its own bound of the bf16 recipe, not equal in fp32
            matches = (row.get("matches") or f"matches {inp.field}={ref} (fp32 rel err {max_rel_err(row):.1e})") + "; "
        return matches + taken
    if out.notes:
        return "; ".join(out.notes)
    if not out.timed and not out.errors:
        if all(r.get("status") == "not_applicable" for r in inp.rows.values()):
            return f"no {inp.field} kernel applies here; the recipe's {value} stands"
        own = any(r.get("precision") for r in inp.rows.values())  # float8's rows: judged in bf16 by their own bound
        check = "its bound against the bf16 recipe" if own else "the fp32 comparison"
        return f"no other {inp.field} value passed {check} and the execution-mode check; {value} stands"
    tried = []
    for cand, t in out.timed.items():
        saving = t["memory_saving"]
        if saving is None:
            memory = "peak memory not measured"
        else:
            memory = f"{abs(saving):.0%} {'less' if saving >= 0 else 'more'} peak memory"
        tried.append(f"{cand} {t['timing'].get('outcome', NOT_MEASURED)}, {memory}")
    tried += [f"{cand} not measured" for cand in out.errors if cand not in out.timed]
    return (f"the recipe's {inp.field}={value} stands: no candidate was faster on whole steps, or saved the "
            f"memory the rule asks and was no slower ({'; '.join(tried)})")  # fmt: skip


def decide_all(inputs: list[FieldInput], *, time: Timer, peak: Peak,
               rule: MemoryRule) -> tuple[list[RecipeEdit], dict[str, FieldChoice]]:  # fmt: skip
    """(recipe edits, {field: FieldChoice}) of every field."""
    choices = {inp.field: decide_field(inp, time=time, peak=peak, rule=rule) for inp in inputs}
    edits = [RecipeEdit(f"kernels.{f}", c.value, c.why) for f, c in choices.items() if c.edit]
    return edits, choices


def mark_rows(rows: dict[str, dict], choices: dict[str, FieldChoice]) -> None:
    """Put each kernel's timing against the holder, its memory figure, and whether the recipe holds it
    after the rung (`kept`) in its per-flag row."""
    for flag, row in rows.items():
        field_name, choice = flag.removeprefix("kernels.").split("=")
        ch = choices.get(field_name)
        if ch is None or row.get("status") == "not_applicable":
            continue
        t = ch.timed.get(choice)
        if t is not None:
            cmp = t["timing"]
            row.update(timing=cmp, timed_against=t["against"], outcome=cmp.get("outcome"), time_ratio=cmp.get("ratio"),
                       time_ratio_ci=[cmp.get("ci_low"), cmp.get("ci_high")],
                       step_time_s=cmp.get("candidate_median_s"), holder_step_time_s=cmp.get("baseline_median_s"),
                       peak_memory_bytes=t["peak"], holder_peak_memory_bytes=t["against_peak"],
                       memory_saving=t["memory_saving"])  # fmt: skip
        if choice in ch.errors:
            row.update(status="raised", error=f"whole steps: {ch.errors[choice]}")
        row["kept"] = choice == ch.value
        if row["kept"]:
            row["why"] = f"kept: the recipe holds kernels.{field_name}={choice} ({ch.why.removeprefix('kernels rung: ')})"
        else:
            row["why"] = f"not kept: the recipe holds kernels.{field_name}={ch.value}"
            mine = [d.why for d in ch.decisions if d.candidate == choice]
            row["reason"] = row.get("reason") or "; ".join(mine)


def all_decisions(choices: dict[str, FieldChoice]) -> list[dict]:
    """Every field's decisions, as `details["decisions"]` holds them."""
    return [d.to_dict() for ch in choices.values() for d in ch.decisions]
