"""The structured parity results: where they go, and writing/reading them.

The workspace test writes them; the rung reads them back. The file is JSON with a flat
`measurements` table (what the checklist evaluates) plus the detail a person needs to
fix a failure (localisation table, mismatched keys, per-parameter gradient errors).
Non-finite floats are kept as JSON `Infinity`/`NaN` (Python's json reads them back), so
a failed comparison stays a failing number rather than a missing one.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from onboard.environment import inherited
from onboard.parity import criteria
from onboard.workspace.fsutil import atomic_write_text

RESULTS_ENV = "ONBOARD_PARITY_RESULTS"
"""Path the results JSON is written to (set by the rung to its attempt folder)."""
WEIGHTS_ENV = "ONBOARD_PARITY_WEIGHTS"
"""Safetensors folder for the upstream weights in a by-hand run of test_parity.py; overrides the one
new-model recorded. The parity rung never passes on an inherited one (onboard/environment.py)."""
SCHEMA = 1
MTIME_SLACK_S = 2.0
"""How much older than the run's start a results file it wrote may look: some filesystems keep
modification times to the second or coarser."""


def results_path(workspace: Path) -> Path:
    """$ONBOARD_PARITY_RESULTS, else <workspace>/runs/parity/results.json (a by-hand run)."""
    env = inherited().get(RESULTS_ENV)
    return Path(env) if env else workspace / "runs" / "parity" / "results.json"


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Write atomically (temp file + rename) so a reader never sees half a file. The ONBOARD_*
    variables the run started with go in as `environment.overrides` (onboard/environment.py):
    a by-hand run's ONBOARD_PARITY_WEIGHTS is on the record of what it compared."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"schema": SCHEMA, **results, "environment": {"overrides": inherited()}}
    atomic_write_text(path, json.dumps(record, indent=2, default=str) + "\n")


def written_by_this_run(path: Path, folder: Path, since: float) -> str | None:
    """Why `path` is not a results file the test run that started at `since` (epoch seconds) wrote
    into `folder` (the attempt folder): a link, a hard link to another file, a file outside the
    folder, or one last written before the run; None when it is."""
    try:
        st = path.lstat()
    except OSError as e:
        return f"{path} cannot be read ({type(e).__name__}: {e})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a link to {os.readlink(path)}, not results this attempt's test wrote"
    if path.resolve().parent != Path(folder).resolve():
        return f"{path} lies outside this attempt's folder {folder}"
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        return f"{path} is not a file of its own (a hard link to another workspace's results?)"
    if st.st_mtime < since - MTIME_SLACK_S:
        return f"{path} was last written before this attempt's test started: results of another run"
    return None


def read_results(path: Path) -> dict[str, Any]:
    """The results a test run wrote; ValueError for a file of another schema version."""
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: parity results schema {data.get('schema')!r}, expected {SCHEMA}")
    return data


def failure_summary(results: dict[str, Any]) -> str:
    """The lines a person reads first when parity fails: error, or where it diverges first."""
    lines = []
    if results.get("error"):
        err = results["error"]
        lines.append(f"{err['kind']} error: {err['message']}")
    check = results.get("weights_check") or {}
    for key, label in (
        ("missing", "checkpoint tensors missing (transformers initialised them)"),
        ("unexpected", "checkpoint tensors the upstream class does not use"),
        ("mismatched", "checkpoint tensors of another shape"),
    ):
        if check.get(key):
            names = check[key]
            of = f" of {check['expected']}" if key == "missing" and check.get("expected") else ""
            more = " ..." if len(names) > 6 else ""
            lines.append(f"{label}: {len(names)}{of}: {', '.join(map(str, names[:6]))}{more}")
    loc_all = results.get("localisation") or {}
    loc = loc_all.get("first")
    if loc:
        where = ""
        if loc_all.get("pass") == "features":
            how = next((p["how"] for p in results.get("passes", []) if p["name"] == "features"), "")
            where = f" in the features pass ({how})"
        lines.append(
            f"first divergence{where}: {loc['native']} (upstream {loc['upstream']}), rel L2 {loc['rel_l2']:.3g}, "
            f"max abs {loc['max_abs']:.3g}: {loc.get('why', '')}"
        )
    sd = results.get("state_dict") or {}
    for key, label in (
        ("missing_after_round_trip", "checkpoint keys lost in HF -> native -> HF"),
        ("extra_after_round_trip", "keys invented by HF -> native -> HF"),
        ("native_not_loaded", "native parameters the checkpoint did not fill"),
        ("shape_mismatch", "shape mismatches"),
    ):
        if sd.get(key):
            lines.append(f"{label}: {', '.join(map(str, sd[key][:6]))}{' ...' if len(sd[key]) > 6 else ''}")
    if sd.get("worst_key"):
        lines.append(f"round trip changes values of {sd['worst_key']}")
    grads = results.get("grads") or {}
    worst = grads.get("worst") or []
    if worst and worst[0]["rel_l2"] > 0:
        where = f" ({grads['pass']} pass)" if grads.get("pass") else ""
        lines.append(f"worst gradient{where}: {worst[0]['param']} rel L2 {worst[0]['rel_l2']:.3g}")
    if grads.get("diagnosis"):
        lines.append(grads["diagnosis"])
    init = (results.get("init") or {}).get("differing") or []
    if init:
        shown = "; ".join(f"{d['tensor']}: {d['why']}" for d in init[:3])
        lines.append(f"init differs from upstream's own: {shown}{' ...' if len(init) > 3 else ''}")
    m = results.get("measurements") or {}
    aux = m.get("aux_loss_abs_diff")
    if isinstance(aux, float) and not aux <= criteria.threshold("aux_loss_abs_diff"):  # NaN included
        how = next((p["measurements"].get("upstream_aux_how") for p in results.get("passes", [])), None)
        lines.append(f"MoE load-balancing term: native {m.get('native_aux_loss')!r}, upstream "
                     f"{m.get('upstream_aux_loss')!r}" + (f" ({how})" if how else ""))  # fmt: skip
    for problem in (results.get("lora") or {}).get("problems") or []:  # onboard/parity/lora_parity.py
        lines.append(f"[lora]: {problem}")
    declared = (results.get("features") or {}).items()
    idle = [f"{name}: {f['how']}" for name, f in declared if f["declared"] and not f["exercised"]]
    if idle:
        lines.append("declared but not exercised: " + "; ".join(idle))
    return "\n".join(lines)
