"""What status / next-step / list show: rich tables for people, plain dicts for --json.

A table cell or a line here may quote a config or a checkpoint (a measured module or tensor name,
an error, a reason): each goes through onboard/sanitize.py (`markup_safe` for a str cell, which rich
reads as markup; `visible` inside a Text); the dicts keep the strings as recorded."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table
from rich.text import Text

from onboard.ladder.evidence import workspace_facts
from onboard.ladder.decision import decision_records, headline
from onboard.ladder.gates import fmt, fmt_threshold, fmt_value, measured_decision
from onboard.ladder.states import RungState, current_state, entry_error, ladder_message, shown_criteria
from onboard.workspace.ledger import ACCEPTED, Entry, Status
from onboard.sanitize import markup_safe, visible

STATUS_STYLE = {
    Status.PASSED: "bold green",
    Status.NOT_APPLICABLE: "cyan",
    Status.FAILED: "bold red",
    Status.STALE: "bold yellow",
    Status.INVALID: "bold white on red",
    Status.INTERRUPTED: "magenta",
    Status.RUNNING: "blue",
    Status.PENDING: "dim",
    Status.NOT_BUILT: "dim italic",
}
# The numbers worth a glance per rung in the ladder table: (metric, label, format).
# Rungs not listed show their first criteria's metrics. No speed figure here: a rung's speed is the
# figure its decisions rest on (`decisions_of`, decision.headline), never a ratio of runs timed apart.
KEY_METRICS = {
    "eager": (("step1_loss", "step-1 loss", "{:.4f}"), ("tokens_per_s", "tok/s", "{:,.0f}"), ("mfu", "MFU", "{:.1%}")),
    "parity": (
        ("logits_rel_l2", "logits", "{:.1e}"),
        ("loss_abs_diff", "loss", "{:.1e}"),
        ("grad_max_rel_l2", "grads", "{:.1e}"),
    ),
    "compile": (("graph_breaks", "breaks", "{:d}"), ("step1_loss_rel_err", "step-1 loss", "{:.1e}")),
    "graph_trainer": (
        ("graphs_per_step", "graphs/step", "{:d}"),
        ("host_syncs", "syncs", "{:d}"),
        ("bit_identical", "bit-identical", None),
    ),
    "kernels": (
        ("kernels_compared", "compared", "{:d}"),
        ("worst_logits_rel_err", "worst logits", "{:.1e}"),
        ("worst_grad_rel_err", "worst grads", "{:.1e}"),
    ),
    "tuning": (
        ("changes_kept", "kept", "{:d}"),
        ("batch_size", "batch", "{:d}"),
        ("profile_biggest", "biggest", None),
    ),
}


def key_numbers(rung: str, entry: Entry | None) -> dict[str, Any]:
    if entry is None:
        return {}
    m = entry.measurements
    names = [k for k, _, _ in KEY_METRICS.get(rung, ())] or [c.get("metric") for c in entry.criteria[:3]]
    return {n: m[n] for n in names if n in m}


def decisions_of(entry: Entry | None) -> list[dict]:
    """The Decision records of a rung's latest entry (`decision_records`), an interval that measured
    nothing shown as not measured (gates.measured_decision)."""
    return [measured_decision(d) for d in decision_records(entry.details)] if entry is not None else []


def headline_of(entry: Entry | None) -> str | None:
    """The rung's headline: the figures its decisions rest on (decision.headline); None without decisions."""
    decisions = decisions_of(entry)
    return headline(decisions) if decisions else None


def key_numbers_text(rung: str, entry: Entry | None) -> str:
    formats = {k: (label, f) for k, label, f in KEY_METRICS.get(rung, ())}
    parts = []
    for name, value in key_numbers(rung, entry).items():
        label, f = formats.get(name, (name, None))
        try:
            parts.append(f"{label} {f.format(value) if f else fmt(value)}")
        except (TypeError, ValueError):  # a non-numeric value ("nan" stored as text): show it as is
            parts.append(f"{label} {fmt(value)}")
    said = headline_of(entry)
    return ", ".join(parts) + (f"; {said}" if said and parts else said or "")


def criteria_table(criteria: list[dict], title: str | None = None) -> Table:
    table = Table(title=title, show_lines=False)
    for col, justify in (("criterion", "left"), ("value", "right"), ("threshold", "left"), ("ok", "center")):
        table.add_column(col, justify=justify)
    for c in criteria:
        if c.get("waived"):
            ok = Text("WAIVED" + ("" if c.get("raw_ok") else " (failed)"), style="bold white on red")
        elif c.get("not_applicable"):  # nothing to compare: never a passing number
            ok = Text("n/a", style="cyan")
        else:
            ok = Text("ok", style="bold green") if c["ok"] else Text("FAIL", style="bold red")
        table.add_row(*(markup_safe(v) for v in (c["name"], fmt_value(c), fmt_threshold(c))), ok)
    return table


def ladder_table(states: list[RungState], title: str | None = None) -> Table:
    table = Table(title=title)
    for col in ("#", "rung", "status", "attempts", "key numbers", "note"):
        table.add_column(col, overflow="fold")
    current = current_state(states)
    for i, s in enumerate(states, 1):
        style = STATUS_STYLE.get(s.status, "")
        marker = "  <- next" if current is not None and s.rung == current.rung else ""
        nums = key_numbers_text(s.rung, s.latest)
        waived = [c["name"] for c in shown_criteria(s) if c.get("waived")]
        note = s.reason or ""
        if waived:
            note = (note + "; " if note else "") + f"WAIVED: {', '.join(waived)}"
        table.add_row(str(i), s.rung, Text(s.status + marker, style=style), str(s.attempts or ""), markup_safe(nums),
                      markup_safe(note))  # fmt: skip
    return table


def state_dict(s: RungState) -> dict:
    last = s.latest
    criteria = shown_criteria(s)
    return {
        "rung": s.rung,
        "status": s.status,
        "attempts": s.attempts,
        "reason": s.reason,
        "last_attempt": last.attempt if last else None,
        "last_started": last.started if last else None,
        "last_ended": last.ended if last else None,
        "key_measurements": key_numbers(s.rung, s.latest),
        "headline": headline_of(s.latest),  # the figures the decisions rest on; None: the rung decided nothing
        "decisions": decisions_of(s.latest),
        "timing_profile": last.details.get("timing_profile") if last else None,  # timing_profiles.TIMING_PROFILES
        "failed_criteria": [c["name"] for c in criteria if not c.get("ok")],
        "waived_criteria": [c["name"] for c in criteria if c.get("waived")],
        "recorded_status": last.status if last else None,
        "invalid_criteria": [
            {k: c.get(k) for k in ("name", "metric", "value", "comparator", "threshold", "threshold_ref", "precision",
                                   "bound_why", "hint", "checks", "waiver_ignored")}  # fmt: skip
            for c in criteria
            if s.status == Status.INVALID and not c.get("ok")
        ],
        # a criterion with nothing to compare says so, instead of a number that reads as a pass
        "not_applicable_criteria": {c["name"]: c["not_applicable"] for c in criteria if c.get("not_applicable")},
        "waivers_ignored": {c["name"]: c["waiver_ignored"] for c in criteria if c.get("waiver_ignored")},
    }


def status_dict(ws, states: list[RungState]) -> dict:
    meta = ws.ledger.meta
    facts, mismatches = workspace_facts(ws)  # from recipe.toml and config.json, not ladder.json's word
    current = current_state(states)
    return {
        "workspace": ws.name,
        "root": str(ws.root),
        "model_type": facts["model_type"],
        "family": facts["family"],
        "ledger_mismatches": mismatches,
        "path": meta.get("path"),
        "source": meta.get("source"),
        "device": ws.device,
        "current_rung": current.rung if current else None,
        "message": ladder_message(states),
        "rungs": [state_dict(s) for s in states],
        "waivers": list(ws.ledger.waivers().values()),
        "unconsumed_keys": meta.get("unconsumed_keys", []),
    }


def show_outcome(print_, outcome) -> None:
    """What a person sees after next-step: the criteria table, the error, the hints of
    failed criteria, the waivers, and one summary line. `print_` is a rich print."""
    if outcome.status == Status.COMPLETE:
        print_(f"[bold green]{markup_safe(outcome.message)}[/]")
        return
    if outcome.criteria:
        print_(criteria_table(outcome.criteria, title=f"{outcome.rung} gate, attempt {outcome.attempt}"))
    error = entry_error(outcome.entry)
    if error:
        print_(Text.assemble(("error: ", "bold red"), visible(error, keep_newlines=True)))
    for c in outcome.criteria:
        if not c["ok"]:
            print_(Text.assemble((visible(c["name"]), "bold red"), ": ", visible(c["hint"], keep_newlines=True)))
            if c.get("waiver_ignored"):
                print_(Text.assemble(("  ", ""), visible(c["waiver_ignored"])))
        elif c.get("waived"):
            print_(Text.assemble(("WAIVED", "bold white on red"), visible(f" {c['name']}: {c['why']}")))
    recipe_edit = outcome.entry.recipe_edit if outcome.entry else None
    for edit in (recipe_edit or {}).get("edits", []):  # what the passed gate wrote into the recipe
        value = json.dumps(edit["value"])  # the value as TOML shows it: strings quoted
        print_(Text.assemble((f"{recipe_edit['file']}: ", "bold"), visible(f"{edit['key']} = {value} ({edit['why']})")))
    style = STATUS_STYLE.get(outcome.status, "magenta")
    nxt = f"; next rung: {outcome.next_rung}" if outcome.status in ACCEPTED and outcome.next_rung else ""
    print_(Text.assemble((visible(outcome.message), style), nxt))
