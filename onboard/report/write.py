"""`onboard report`: REPORT.md (a ten-second summary, the pictures, then the evidence of
every rung as tables, waivers first), the PNG pictures beside it and report.html.

What the summary and the pictures show is computed from the ledger by onboard.report.facts
and drawn by onboard.report.pictures; report.html is REPORT.md with the pictures embedded
(onboard.report.html). REPORT.md is written last, so it never names a picture that is not there.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from onboard.errors import BadInput
from onboard.ladder.evidence import INVALID, workspace_facts
from onboard.workspace.fsutil import atomic_write_text
from onboard.ladder.gates import ChecklistError, load_checklist
from onboard.ladder.states import NOT_BUILT, ladder_states
from onboard.ladder.table import RungSpec, default_specs
from onboard.workspace.ledger import ACCEPTED, Status, now_iso
from onboard.parity.results import read_results
from onboard.report.facts import (
    Bar,
    Record,
    ValSeries,
    loss_series,
    parity_points,
    records,
    speedup,
    val_loss_series,
    waterfall_bars,
)
from onboard.report.html import DETAILS_CLOSE, DETAILS_OPEN, render, table
from onboard.report.memory_facts import TensorPeaks, memory_bars, policy_bars, tensor_lines, tensor_peaks
from onboard.report.speed_section import decision_lines, kept_decisions, speed_table, waterfall_lines
from onboard.ladder.decision import headline
from onboard.report.steps import Step, waterfall_steps
from onboard.report.pictures import (
    Picture,
    draw_loss,
    draw_memory,
    draw_parity,
    draw_waterfall,
    write_picture,
)
from onboard.ladder.decision import decision_records
from onboard.ladder.measurements.retired import shown_measurements
from onboard.ladder.gates import fmt, fmt_threshold, fmt_value, measured_decision
from onboard.ladder.states import ladder_message, shown_criteria
from onboard.workspace.layout import REPORT, Workspace
from onboard.sanitize import html_safe, visible

HTML = "report.html"
WATERFALL, LOSS, PARITY, MEMORY = "waterfall.png", "loss_curves.png", "parity.png", "memory.png"


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
    lines += table(
        ["rung", "criterion", "why", "by", "when"],
        [[f"**{w['rung']}**", f"**{w['criterion']}**", w["why"] + _ignored(w), w.get("by", ""), w["time"][:19]]
         for w in waivers],
    )  # fmt: skip
    return lines + [""]


def _ignored(waiver: dict) -> str:
    """What the report adds to a waiver no gate counts (finiteness, every run whole: gates.UNWAIVABLE_METRICS)."""
    try:
        c = load_checklist(waiver["rung"]).criterion(waiver["criterion"])
    except ChecklistError:  # a rung not built yet: its waiver has nothing to count against
        return ""
    return f" (**ignored**: {c.unwaivable_why()})" if c is not None and not c.waivable else ""


def _criteria(criteria: list[dict]) -> list[str]:
    rows = []
    for c in criteria:
        if c.get("waived"):
            ok = "🔴 **WAIVED**" + ("" if c.get("raw_ok") else " (failed)") + f": {c.get('why')}"
        elif c.get("not_applicable"):  # nothing to compare: said, never shown as a passing number
            ok = "➖ not applicable"
        else:
            ok = "✅ ok" if c["ok"] else "❌ **FAIL**"
            ok += " (waiver ignored: it cannot be waived)" if c.get("waiver_ignored") else ""
        rows.append([c["name"], fmt_value(c), fmt_threshold(c), ok])
    lines = table(["criterion", "value", "threshold", "ok"], rows) if rows else ["(no criteria evaluated)"]
    said = [c for c in criteria if c.get("checks")]
    if said:
        lines += ["", "What each criterion compares:", ""]
        lines += [f"- **{c['name']}**: {c['checks']}" for c in said]
    failed = [c for c in criteria if not c["ok"]]
    if failed:
        lines += ["", "Hints for the failed criteria:", ""]
        lines += [f"- **{c['name']}**: {c['hint']}" + (f" ({c['waiver_ignored']})" if c.get("waiver_ignored") else "")
                  for c in failed]  # fmt: skip
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
        ["model", entry.get("model") or "not recorded (an entry older than the twin)"],
        [
            "versions",
            ", ".join(f"{k} {env[k]}" for k in ("python", "torch", "transformers", "titan-onboard") if k in env),
        ],
        ["attempt folder", entry.get("attempt_dir")],
    ]
    if entry.get("rerun_reason"):
        rows.append(["re-run because", entry["rerun_reason"]])
    details = entry.get("details") or {}
    if details.get("timing_profile"):  # timing_profiles.TIMING_PROFILES: what its keep/choose decisions were timed with
        profile = details["timing_profile"]
        note = "the checklist's protocol" if profile == "shipped" else "**shortened, not the checklist's protocol**"
        rows.append(["timing profile", f"{profile}: {note} `{json.dumps(details.get('timing_protocol'))}`"])
    if entry.get("not_applicable_reason"):
        rows.append(["not applicable", entry["not_applicable_reason"]])
    if entry.get("error"):
        rows.append(["error", entry["error"]])
    lines = table(["evidence", ""], rows)
    files = entry.get("files_read") or {}
    if files:
        lines += ["", *table(["file read", "sha256"], [[f"`{k}`", (v or "missing")[:16]] for k, v in files.items()])]
    return lines


def _decisions(entry: dict) -> list[str]:
    """The rung's decisions: its headline (what `onboard status` prints), then one row per lever decided."""
    decisions = [measured_decision(d) for d in decision_records(entry.get("details") or {})]
    if not decisions:
        return []
    rows = [[f"`{d['lever']}`", f"`{json.dumps(d['holder'])}`", f"`{json.dumps(d['candidate'])}`",
             f"`{json.dumps(d['value'])}`", d["verdict"], d.get("why", "")] for d in decisions]  # fmt: skip
    lines = ["", f"Decisions (headline: {headline(decisions)}):", ""]
    return lines + table(["lever", "holder", "candidate", "holds now", "verdict", "why"], rows)


CURVES = (("loss_curve", "Loss by step"), ("grad_norm_curve", "Grad norm by step"))


def _details(entry: dict) -> list[str]:
    details = dict(entry.get("details") or {})
    lines = []
    for key, label in CURVES:
        curve = details.pop(key, None)
        if curve:
            lines += ["", f"{label}: " + ", ".join(f"{x:.4f}" if isinstance(x, float) else str(x) for x in curve)]
    if details:
        lines += ["", DETAILS_OPEN, "", "```json"]
        lines += [json.dumps(details, indent=2, default=str), "```", "", DETAILS_CLOSE]
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
    if state.reason and state.status == Status.STALE:
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
        lines += table(["key", "value", "why"], rows)
    lines += _decisions(entry)
    # an older ledger's retired measurements are not shown (measurements/retired.py)
    measurements = shown_measurements(entry.get("measurements") or {})
    if measurements:
        lines += ["", *table(["measurement", "value"], [[k, fmt(v)] for k, v in measurements.items()])]
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
        lines += ["", "Earlier attempts:", "", *table(["attempt", "status", "started", "failed criteria"], rows)]
    return lines + [""]


# ---- summary and pictures --------------------------------------------------------------------


def _eager_env(recs: list[Record]) -> dict:
    eager = next((r for r in recs if r.rung == "eager"), None)
    return (eager.entry.get("environment") or {}) if eager else {}


def _summary(ws: Workspace, recs: list[Record], states, bars: list[Bar], steps: list[Step]) -> tuple[list[str], dict]:
    """The lines a person reads first, and the same facts for --json."""
    meta, env = ws.ledger.meta, _eager_env(recs)
    model_facts, _ = workspace_facts(ws)  # the workspace's files, not ladder.json's word
    eager = next((r for r in recs if r.rung == "eager"), None)
    params = eager.m.get("num_params") if eager else None
    device = env.get("device") or ws.device
    accepted = sum(s.status in ACCEPTED for s in states)
    built = sum(s.status != NOT_BUILT for s in states)
    model = f"`{model_facts['model_type']}` (family `{model_facts['family']}`, {meta.get('path')} path"
    model += f", {params:,} parameters)" if isinstance(params, int) else ")"
    torch = f" (torch {env['torch']})" if env.get("torch") else ""
    lines = ["## Summary", "", f"**{ws.name}**: {model} on **{device}**{torch}; {accepted} of {built} built rungs "
             f"passed or do not apply; {ladder_message(states)}.", ""]  # fmt: skip
    waivers = list(ws.ledger.waivers().values())
    facts = {"model_type": model_facts["model_type"], "device": device, "num_params": params,
             "rungs_accepted": accepted, "rungs_built": built, "waivers": len(waivers)}  # fmt: skip
    lines += _twin_lines(ws, eager)
    facts["model"] = ws.model_label()
    lines += decision_lines(recs)
    facts["kept_decisions"] = [d for _, d in kept_decisions(recs)]
    facts["headlines"] = {r.rung: headline(r.decisions) for r in recs if r.decisions}
    speed = speedup(bars)
    if speed is None:
        lines += ["Step time: no passed eager run yet, so no baseline to compare with.", ""]
    else:
        lines += speed_table(bars, speed, cpu=device == "cpu", steps=steps)
        facts.update(speed)
        facts["protocol_speedup"] = dataclasses.asdict(steps[-1].cumulative) if steps[-1].cumulative else None
        facts["waterfall"] = [s.as_dict() for s in steps]
    if waivers:
        named = ", ".join(f"{w['rung']} `{w['criterion']}`" for w in waivers)
        lines += [f"**Waivers: {len(waivers)}**: {named} (below, in red).", ""]
    else:
        lines += ["Waivers: none.", ""]
    return lines, facts


def _twin_lines(ws: Workspace, eager: Record | None) -> list[str]:
    """The summary's word on which model the rungs ran: the twin, and what eager checked of the full one."""
    if ws.twin_path is None:
        return []
    m = eager.m if eager else {}
    full = (
        f" The full model was checked on the meta device by eager: {m['full_model_params_total']:,} parameters "
        f"({m['full_model_params_active']:,} active per token), {m.get('full_model_key_mismatches')} name/shape "
        f"mismatches against {m.get('full_model_keys_reference')}; checkpoint: {m.get('full_model_checkpoint')}."
        if "full_model_params_total" in m
        else " The full model has not been checked yet (eager has not passed)."
    )
    return [
        f"**Every rung ran on a twin** of the model ({ws.model_label()}), because the full model does not fit "
        f"the gates here (README.md: what shrank and why).{full} `onboard plan {ws.name} --target KIND:COUNT` "
        "sizes the full model for its target.",
        "",
    ]


def _parity_results(ws: Workspace, rec: Record) -> tuple[dict | None, str]:
    """The parity attempt's results.json (where the per-module table lives), or why not."""
    given = rec.details.get("results_file")
    candidates = [Path(given)] if given else []
    if rec.entry.get("attempt_dir"):
        candidates.append(ws.root / rec.entry["attempt_dir"] / "results.json")
    for path in candidates:
        if path.is_file():
            try:
                return read_results(path), ""
            except (OSError, ValueError) as e:
                return None, f"{path} cannot be read: {e}"
    return None, f"parity attempt {rec.entry.get('attempt')} left no results.json"


def _draw_pictures(ws: Workspace, recs: list[Record], steps: list[Step], val: list[ValSeries],
                   tensors: TensorPeaks) -> list[Picture]:  # fmt: skip
    """Draw and write every picture there is data for; one with none is removed (it would show old data)."""
    parity = next((r for r in recs if r.rung == "parity"), None)
    points, parity_why = None, "the parity rung has not run"
    if parity is not None:
        results, parity_why = _parity_results(ws, parity)
        points = parity_points(results, parity.status) if results else None
        parity_why = parity_why or "its results.json has no per-module localisation table"
    series, mem = loss_series(recs), memory_bars(recs)
    policy_rung, policies = policy_bars(recs)
    device = _eager_env(recs).get("device")
    plan = [  # (file, title, how to draw it or None, why it is not drawn)
        (
            WATERFALL,
            "Speed-up per rung by its own interleaved timing, and the product of the kept ones",
            (lambda: draw_waterfall(steps)) if steps else None,
            "no passed eager run to start from",
        ),
        (
            LOSS,
            "Loss curves over the eager baseline",
            (lambda: draw_loss(series, val)) if series else None,
            "no rung recorded a loss curve",
        ),
        (PARITY, "Parity along the model", (lambda: draw_parity(points)) if points else None, parity_why),
        (
            MEMORY,
            "Memory: each run's peak, and each kernel's tensor bytes",
            (lambda: draw_memory(mem, policy_rung, policies, device=device, tensors=tensors)) if mem else None,
            "no rung recorded peak memory",
        ),
    ]
    pictures = []
    for name, title, draw, why in plan:
        path = ws.root / name
        if draw is None:
            path.unlink(missing_ok=True)
            pictures.append(Picture(name, title, None, why))
        else:
            pictures.append(Picture(name, title, write_picture(draw(), path)))
    return pictures


def _val_lines(val: list[ValSeries]) -> list[str]:
    """Under the loss picture: each validated run's held-out loss, the numbers the dashed curves draw."""
    if not val:
        return []
    lines = ["Validation loss (dashed in the picture), by step:", ""]
    for v in val:
        points = ", ".join(f"{step}: {value:.4f}" for step, value in zip(v.steps, v.values))
        lines.append(f"- {v.rung}{' ' + v.run if v.run else ''} (`{v.file}`): {points}")
    return lines + [""]


def _pictures_section(pictures: list[Picture], bars: list[Bar], steps: list[Step], val: list[ValSeries],
                      tensors: TensorPeaks) -> list[str]:  # fmt: skip
    lines = ["## Pictures", ""]
    for pic in pictures:
        lines += [f"![{pic.title}]({pic.name})" if pic.path else f"*{pic.title}: not drawn: {pic.why}.*", ""]
        if pic.name == WATERFALL and steps:
            lines += waterfall_lines(bars, steps)
        if pic.name == LOSS and pic.path:
            lines += _val_lines(val)
        if pic.name == MEMORY and pic.path:
            lines += tensor_lines(tensors)
    return lines


@dataclass
class ReportFiles:
    """What `onboard report` wrote: REPORT.md, report.html, the pictures, and the summary's facts."""

    markdown: Path
    html: Path
    pictures: list[Picture] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    def picture(self, name: str) -> Path | None:
        return next((p.path for p in self.pictures if p.name == name), None)

    def where(self, name: str) -> str:
        """The picture's path, or why it was not drawn (for a person)."""
        pic = next(p for p in self.pictures if p.name == name)
        return str(pic.path) if pic.path else f"not drawn: {pic.why}"

    def to_json(self) -> dict:
        waterfall = self.picture(WATERFALL)
        return {
            "report": str(self.markdown),
            "html": str(self.html),
            "waterfall": str(waterfall) if waterfall else None,
            "pictures": {p.name: str(p.path) if p.path else None for p in self.pictures},
            "pictures_not_drawn": {p.name: p.why for p in self.pictures if p.path is None},
            "summary": self.summary,
        }


def write_report_files(ws: Workspace, specs: list[RungSpec] | None = None) -> ReportFiles:
    """Write the pictures, report.html and REPORT.md into the workspace."""
    specs = specs or default_specs()
    states = ladder_states(ws, specs)
    meta = ws.ledger.meta
    model_facts, mismatches = workspace_facts(ws)  # the workspace's files, not ladder.json's word
    recs = records(states)
    try:
        recipe = ws.recipe()
    except BadInput:  # a person's edit broke recipe.toml: no bar can be the final recipe's
        recipe = {}
    bars = waterfall_bars(recs, ws.ledger.attempts, recipe)
    steps = waterfall_steps(recs) if bars else []
    summary, facts = _summary(ws, recs, states, bars, steps)
    val = val_loss_series(recs, ws.root)
    facts["validation"] = [{"rung": v.rung, "run": v.run, "file": v.file, "steps": v.steps, "val_loss": v.values}
                           for v in val]  # fmt: skip
    tensors = tensor_peaks(recs)
    facts["tensor_peaks"] = [dataclasses.asdict(b) for b in tensors.bars] or tensors.why_none
    pictures = _draw_pictures(ws, recs, steps, val, tensors)
    lines = [
        f"# Onboarding report: {ws.name}",
        "",
        f"`{model_facts['model_type']}` on the **{meta.get('path')}** path (family `{model_facts['family']}`), "
        f"device `{ws.device}`; made with `{meta.get('source')}`. Generated {now_iso()[:19]}.",
        "",
        *[f"**{html_safe(line)}**" for line in mismatches],  # ladder.json's text: no HTML of its own
        *([""] if mismatches else []),
        *summary,
        *_waivers(ws),
        *_pictures_section(pictures, bars, steps, val, tensors),
        "## Ladder",
        "",
        *table(
            ["#", "rung", "status", "attempts", "note"],
            [[i, s.rung, f"**{s.status}**", s.attempts or "", s.reason or ""] for i, s in enumerate(states, 1)],
        ),
        "",
        ladder_message(states),
        "",
    ]
    unconsumed = meta.get("unconsumed_keys") or []
    if unconsumed:
        lines += [
            "Config keys the family does not consume (each must be handled or irrelevant): "
            + ", ".join(f"`{k}`" for k in unconsumed),
            "",
        ]
    by_name = {s.name: s for s in specs}
    for state in states:
        lines += _rung_section(ws, state, by_name[state.rung])
    # the ledger's strings (a config's, a checkpoint's) may hold control characters: REPORT.md is
    # read in terminals too (cat, less -R), so none reaches the file as it is
    text = visible("\n".join(lines).rstrip() + "\n", keep_newlines=True)
    html_path = ws.root / HTML
    shown = {p.name: p.path for p in pictures if p.path}
    atomic_write_text(html_path, render(text, shown, title=f"Onboarding report: {ws.name}"))
    path = ws.root / REPORT
    atomic_write_text(path, text)
    return ReportFiles(path, html_path, pictures, facts)


def write_report(ws: Workspace, specs: list[RungSpec] | None = None) -> Path:
    """Write REPORT.md (with its pictures and report.html) into the workspace and return its path."""
    return write_report_files(ws, specs).markdown
