"""The check the demo climb runs on its workspace (issue 33): REPORT.md's and `onboard status`'s
headline figures are the decision figures in the ledger, for every rung that decided something.

`check_headlines(workspace_root)` reads ladder.json itself, runs `onboard status --json` through the
console script and reads REPORT.md (written by the climb), so it checks what a person reads, not
the functions that wrote it. tests/onboard/cli/test_headlines.py runs it on a scripted ledger."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from onboard.ladder.decision import KEPT, headline

ONBOARD = Path(sys.executable).parent / "onboard"
SPEED = re.compile(r"\d+\.\d+x")
"""A speed figure as the report writes one."""


def decided(ledger: dict) -> dict[str, tuple[str, list[dict]]]:
    """{rung: (its latest entry's recorded status, its Decision records)} for every rung whose latest entry has some."""
    latest = {e["rung"]: e for e in ledger["attempts"]}
    out = {}
    for rung, e in latest.items():
        found = (e.get("details") or {}).get("decisions")
        if isinstance(found, list) and found:
            out[rung] = (e["status"], found)
    return out


def figure(d: dict) -> str:
    """The figure of one decision as decision.headline writes it ("1.22x (1.14-1.31)", "not measured")."""
    return headline([d]).rsplit(": ", 1)[1].rsplit(" ", 1)[0]


def check_headlines(workspace_root) -> None:
    """Assert that `onboard status --json` and REPORT.md of the workspace at `workspace_root`
    (onboarding/NAME) show, for each rung, its ledger decisions' headline and no other speed figure,
    and that REPORT.md's summary sets in bold exactly the kept decisions' figures."""
    root = Path(workspace_root)
    ledger = json.loads((root / "ladder.json").read_text())
    by_rung = decided(ledger)
    argv = [ONBOARD, "status", root.name, "--dir", root.parent.parent, "--json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    status = {r["rung"]: r for r in json.loads(result.stdout)["rungs"]}
    for rung, row in status.items():
        decisions = by_rung.get(rung, (None, []))[1]
        assert row["decisions"] == decisions, rung
        assert row["headline"] == (headline(decisions) if decisions else None), rung
        for name, value in row["key_measurements"].items():  # no speed figure but the decisions'
            assert not (isinstance(value, str) and SPEED.search(value)), (rung, name, value)
            assert "speedup" not in name and not name.endswith("_vs_eager"), (rung, name)

    report = (root / "REPORT.md").read_text()
    summary = report.split("## Summary", 1)[1].split("\n## ", 1)[0]
    kept = [d for state, ds in by_rung.values() if state == "passed" for d in ds if d["verdict"] == KEPT]
    figures = {figure(d) for d in kept}
    for d in kept:
        assert f"**{figure(d)}**" in summary, (d["rung"], d["lever"], figure(d))
    bold = re.findall(r"\*\*([^*]+)\*\*", summary)
    assert {b for b in bold if SPEED.search(b)} <= figures, bold  # nothing else bold is a speed
    if by_rung and not kept:
        assert "**No rung kept a change**" in summary
    if "| step time |" in summary:  # the ratio of two runs timed apart: there, labelled, never the headline
        row = next(line for line in summary.splitlines() if line.startswith("| step time |"))
        assert "**" not in row and ("not a decision" in row or SPEED.search(row) is None), row
    for rung, (_, ds) in by_rung.items():
        assert f"Decisions (headline: {headline(ds)}):" in report, rung
