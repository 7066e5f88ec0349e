"""`onboard report`: REPORT.md, the evidence of every rung as tables, waivers first."""

from __future__ import annotations

import json
from pathlib import Path

from onboard.evidence import INVALID
from onboard.fsutil import atomic_write_text
from onboard.gates import ChecklistError
from onboard.ladder import NOT_BUILT, RungSpec, default_specs, ladder_states
from onboard.ledger import now_iso
from onboard.views import fmt, fmt_threshold, ladder_message, shown_criteria
from onboard.workspace import REPORT, Workspace


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _waivers(ws: Workspace) -> list[str]:
    waivers = list(ws.ledger.waivers().values())
    if not waivers:
        return []
    lines = [
        "## 🔴 WAIVED CRITERIA",
        "",
        "**These gates pass only because a person waived a criterion. Each waiver is on the record below.**",
        "",
    ]
    lines += _table(
        ["rung", "criterion", "why", "by", "when"],
        [[f"**{w['rung']}**", f"**{w['criterion']}**", w["why"], w.get("by", ""), w["time"][:19]] for w in waivers],
    )
    return lines + [""]


def _criteria(criteria: list[dict]) -> list[str]:
    rows = []
    for c in criteria:
        if c.get("waived"):
            ok = "🔴 **WAIVED**" + ("" if c.get("raw_ok") else " (failed)") + f": {c.get('why')}"
        else:
            ok = "✅ ok" if c["ok"] else "❌ **FAIL**"
        rows.append([c["name"], fmt(c["value"]), fmt_threshold(c), ok])
    lines = _table(["criterion", "value", "threshold", "ok"], rows) if rows else ["(no criteria evaluated)"]
    failed = [c for c in criteria if not c["ok"]]
    if failed:
        lines += ["", "Hints for the failed criteria:", ""]
        lines += [f"- **{c['name']}**: {c['hint']}" for c in failed]
    return lines


def _evidence(ws: Workspace, entry: dict, status: str) -> list[str]:
    env = entry.get("environment", {})
    recorded = "" if status == entry.get("status") else f"; ladder.json says {entry.get('status')}"
    rows = [
        ["status", f"**{status}** (attempt {entry.get('attempt')}{recorded})"],
        ["command", f"`{entry.get('command', '')}`"],
        ["started", entry.get("started")],
        ["ended", entry.get("ended") or "never (the process was killed)"],
        ["duration", f"{entry.get('duration_s', '?')} s"],
        ["device", env.get("device")],
        [
            "versions",
            ", ".join(f"{k} {env[k]}" for k in ("python", "torch", "transformers", "titan-onboard") if k in env),
        ],
        ["attempt folder", entry.get("attempt_dir")],
    ]
    if entry.get("rerun_reason"):
        rows.append(["re-run because", entry["rerun_reason"]])
    if entry.get("not_applicable_reason"):
        rows.append(["not applicable", entry["not_applicable_reason"]])
    if entry.get("error"):
        rows.append(["error", entry["error"]])
    lines = _table(["evidence", ""], rows)
    files = entry.get("files_read") or {}
    if files:
        lines += ["", *_table(["file read", "sha256"], [[f"`{k}`", (v or "missing")[:16]] for k, v in files.items()])]
    return lines


CURVES = (("loss_curve", "Loss by step"), ("grad_norm_curve", "Grad norm by step"))


def _details(entry: dict) -> list[str]:
    details = dict(entry.get("details") or {})
    lines = []
    for key, label in CURVES:
        curve = details.pop(key, None)
        if curve:
            lines += ["", f"{label}: " + ", ".join(f"{x:.4f}" if isinstance(x, float) else str(x) for x in curve)]
    if details:
        lines += ["", "<details><summary>details</summary>", "", "```json"]
        lines += [json.dumps(details, indent=2, default=str), "```", "", "</details>"]
    return lines


def _rung_section(ws: Workspace, state, spec: RungSpec) -> list[str]:
    lines = [f"## {state.rung}: {state.status}", ""]
    if state.status == NOT_BUILT:
        return lines + ["This rung is not built yet in this version of onboard.", ""]
    try:
        checklist = spec.load_checklist()
        lines += [f"*{checklist.title}*", ""]
    except ChecklistError:
        checklist = None
    entry = state.latest
    if entry is None:
        return lines + ["Not attempted yet.", ""]
    if state.reason and state.status == "stale":
        lines += [f"**Stale**: {state.reason}. `onboard next-step {ws.name}` re-verifies it.", ""]
    if state.status == INVALID:
        lines += [
            f"**❌ Invalid**: the ledger entry is not evidence: {state.reason}. "
            f"The criteria below are re-evaluated from its recorded measurements; "
            f"`onboard next-step {ws.name}` re-runs the rung.",
            "",
        ]
    lines += _evidence(ws, entry, state.status) + [""] + _criteria(shown_criteria(state))
    edit = entry.get("recipe_edit")
    if edit:  # the flags this passed gate wrote into the recipe, each with its reason
        before, after = ((edit.get(k) or "missing")[:16] for k in ("sha256_before", "sha256_after"))
        lines += ["", f"Recipe edits (`{edit['file']}`, sha256 {before} -> {after}):", ""]
        rows = [[f"`{e['key']}`", f"`{json.dumps(e['value'])}`", e["why"]] for e in edit["edits"]]
        lines += _table(["key", "value", "why"], rows)
    measurements = entry.get("measurements") or {}
    if measurements:
        lines += ["", *_table(["measurement", "value"], [[k, fmt(v)] for k, v in measurements.items()])]
    lines += _details(entry)
    if checklist and checklist.human:
        lines += ["", "Checks for a person:", ""] + [f"- [ ] {h}" for h in checklist.human]
    earlier = ws.ledger.entries(state.rung)[:-1]
    if earlier:
        rows = [
            [
                e["attempt"],
                e["status"],
                (e.get("started") or "")[:19],
                ", ".join(c["name"] for c in e.get("criteria", []) if not c["ok"]),
            ]
            for e in earlier
        ]
        lines += ["", "Earlier attempts:", "", *_table(["attempt", "status", "started", "failed criteria"], rows)]
    return lines + [""]


def write_report(ws: Workspace, specs: list[RungSpec] | None = None) -> Path:
    """Write REPORT.md into the workspace and return its path."""
    specs = specs or default_specs()
    states = ladder_states(ws, specs)
    meta = ws.ledger.meta
    lines = [
        f"# Onboarding report: {ws.name}",
        "",
        f"`{meta.get('model_type')}` on the **{meta.get('path')}** path (family `{meta.get('family')}`), "
        f"device `{ws.device}`; made with `{meta.get('source')}`. Generated {now_iso()[:19]}.",
        "",
        *_waivers(ws),
        "## Ladder",
        "",
        *_table(
            ["#", "rung", "status", "attempts", "note"],
            [[i, s.rung, f"**{s.status}**", s.attempts or "", s.reason or ""] for i, s in enumerate(states, 1)],
        ),
        "",
        ladder_message(states),
        "",
    ]
    unconsumed = meta.get("unconsumed_keys") or []
    if unconsumed:
        lines += ["Config keys the family does not consume (each must be handled or irrelevant): "
                  + ", ".join(f"`{k}`" for k in unconsumed), ""]  # fmt: skip
    by_name = {s.name: s for s in specs}
    for state in states:
        lines += _rung_section(ws, state, by_name[state.rung])
    path = ws.root / REPORT
    atomic_write_text(path, "\n".join(lines).rstrip() + "\n")
    return path
