"""The compat table as Markdown (docs/COMPATIBILITY.md) and for a terminal, and the files a
sweep keeps it in (each rewritten atomically after every architecture)."""

from __future__ import annotations

import json
from pathlib import Path

from onboard.compat.climb import QUICK_TIMING
from onboard.compat.tiny import causal_lm_types
from onboard.errors import BadInput
from onboard.workspace.fsutil import atomic_write_text

MARKS = {"pass": "pass", "fail": "fail", "not_applicable": "n/a", "not_reached": "not reached"}
EXPLAINED = ("fail", "not_applicable")
"""The cells whose reason the tables print (a not-reached cell's reason is the failed cell before it)."""


def _of(n, result: dict) -> str:
    """`n` of the counted types, with its share; of a partial sweep, of the counted types it finished."""
    counted = result.get("counted", result["requested"])
    if result["remaining"]:
        counted -= len(result["remaining"])
        return f"{n} of the {counted} finished ({100 * n / counted:.0f}%)" if counted else str(n)
    return f"{n} of {counted} ({100 * n / counted:.0f}%)" if isinstance(n, int) and counted else str(n)


def render_markdown(result: dict, *, header: str = "") -> str:
    """Counts, then model_type x rung, then the failing (and not applicable) cells' reasons, then not probed."""
    rungs = result["rungs"]
    lines = [header.rstrip(), ""] if header else []
    lines += [
        f"Swept {result.get('date', '?')} in {result.get('wall_seconds', 0) / 60:.0f} min of wall time "
        f"(probes {result['seconds'] / 60:.0f} min, summed). transformers {result['transformers']}; "
        f"{result['probed']} architectures probed of {result['requested']} requested "
        f"({len(result['not_probed'])} not probed, {len(result.get('not_causal', []))} of them measured not to be "
        f"causal LMs at all, so {result.get('counted', result['requested'])} counted); "
        f"eager and parity passing: {_of(result.get('eager_and_parity'), result)}; "
        f"every rung passing: {_of(result['all_pass'], result)}. Each probe climbs the ladder with `onboard next-step` on a "
        f"tiny config (timing decisions shortened to {QUICK_TIMING['max_rounds']} rounds: the cells say what "
        "passes, not what is fastest).",
        "",
    ]
    lines += _partial(result)
    shipped = len(causal_lm_types())
    if result["requested"] < shipped:
        lines += [
            f"A subset: {result['requested']} of the {shipped} causal-LM model_types this transformers ships; "
            "`onboard compat` with no arguments (`make compat COMPAT_TYPES=`) probes them all, many hours on 2 CPU cores.",
            "",
        ]
    lines += [
        "| rung | passing |",
        "|---|---|",
        *[f"| {r} | {result['passing'][r]} / {result['probed']} |" for r in rungs],
        "",
        "| model_type | " + " | ".join(rungs) + " |",
        "|---" * (len(rungs) + 1) + "|",
    ]
    reasons = []
    for mt, row in result["rows"].items():
        cells = [row["cells"][r] for r in rungs]
        lines.append(f"| {mt} | " + " | ".join(MARKS[c["status"]] for c in cells) + " |")
        reasons += [
            f"- **{mt} / {r}** ({MARKS[c['status']]}): {c['reason']}"
            for r, c in zip(rungs, cells)
            if c["status"] in EXPLAINED
        ]
    if reasons:
        lines += ["", "## Why not", "", *reasons]
    if result["not_probed"]:
        lines += ["", "## Not probed", "", *[f"- **{mt}**: {why}" for mt, why in result["not_probed"].items()]]
    return "\n".join(lines) + "\n"


def _partial(result: dict) -> list[str]:
    """The note of a sweep that did not finish (interrupted): what is missing and how to go on."""
    if not result["remaining"]:
        return []
    stopped = f"interrupted while probing {result['interrupted']}; " if result["interrupted"] else ""
    return [
        f"**Partial**: {stopped}{len(result['remaining'])} of {result['requested']} model_types not probed yet "
        "(`--resume` with the same `--results` file goes on from here).",
        "",
    ]


def render_text(result: dict) -> str:
    """The table for a terminal: one row per model_type, a failing cell's reason under its row."""
    rungs = result["rungs"]
    width = max([len("model_type"), *map(len, result["rows"])])
    out = ["model_type".ljust(width) + "  " + "  ".join(r.ljust(13) for r in rungs)]
    for mt, row in result["rows"].items():
        cells = [row["cells"][r] for r in rungs]
        out.append(mt.ljust(width) + "  " + "  ".join(MARKS[c["status"]].ljust(13) for c in cells))
        out += [f"{'':{width}}    {r}: {c['reason']}" for r, c in zip(rungs, cells) if c["status"] in EXPLAINED]
    out.append("passing: " + ", ".join(f"{r} {result['passing'][r]}/{result['probed']}" for r in rungs))
    out += [f"not probed: {mt}: {why}" for mt, why in result["not_probed"].items()]
    if result["remaining"]:
        out.append(f"not probed yet: {', '.join(result['remaining'])}")
    return "\n".join(out) + "\n"


def check_destinations(*paths: Path | None) -> None:
    """BadInput before any probe runs when a table file could not be written (its folder missing, or a folder)."""
    for path in paths:
        if path is None:
            continue
        if path.is_dir():
            raise BadInput(f"{path} is a folder; give the file the table is written to")
        if not path.parent.is_dir():
            raise BadInput(f"{path}: the folder {path.parent} does not exist")


def write_tables(result: dict, *, markdown: Path | None, results: Path | None, header: str) -> None:
    """The results file (the --json table) and the Markdown, each replaced atomically."""
    if results is not None:
        atomic_write_text(results, json.dumps(result, indent=1) + "\n")
    if markdown is not None:
        atomic_write_text(markdown, render_markdown(result, header=header))
