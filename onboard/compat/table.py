"""The compat table as Markdown (docs/COMPATIBILITY.md) and for a terminal, and the files a
sweep keeps it in (each rewritten atomically after every architecture).

A table file that exists already is a person's (a sweep of hours): a sweep replaces it only
with `--force`, which first moves it to `<name>.backup-<time>` (`replaced_tables`). `--resume`
goes on from the --results file instead, and so may rewrite it, and the Markdown, which is its
rendering, unless the sweep names fewer model_types than the file holds: the rewritten table
would drop the others, so that needs `--force` too."""

from __future__ import annotations

import json
from pathlib import Path

from onboard.compat.climb import QUICK_TIMING
from onboard.compat.tiny import causal_lm_types
from onboard.errors import BadInput
from onboard.workspace.fsutil import BACKUP_INFIX, atomic_write_text

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


def replaced_tables(
    results: Path | None, markdown: Path | None, *, resume: bool, previous: dict | None, types: list[str]
) -> list[tuple[str, Path, str]]:
    """(JSON key of its backup, path, the one-line refusal) of each table file the sweep would replace:
    without `resume` any that exists; with it the --results file only when `previous` (the table it
    holds) has model_types outside `types`, which the rewritten table would drop; the Markdown unless
    it is the rendering of the table resumed."""
    replaced = []
    if results is not None and results.exists() and not resume:
        replaced.append(("backup", results, (
            f"--results {results} already holds a table{_held(results)}; pass --resume to go on from its rows, or "
            f"--force to start over (the old file is then kept as {results.name}{BACKUP_INFIX}<time>)"
        )))  # fmt: skip
    if results is not None and previous is not None:
        dropped = [mt for mt in (*previous["rows"], *previous["not_probed"]) if mt not in types]
        if dropped:
            shown = ", ".join(dropped[:3]) + (", ..." if len(dropped) > 3 else "")
            replaced.append(("backup", results, (
                f"--resume: {results} holds {len(dropped)} model_types this sweep does not name ({shown}), which the "
                "rewritten table would drop; name them too, or pass --force to rewrite it without them (the old file "
                f"is then kept as {results.name}{BACKUP_INFIX}<time>)"
            )))  # fmt: skip
    if markdown is not None and markdown.exists() and previous is None:  # not the rendering of a table resumed
        replaced.append(("markdown_backup", markdown, (
            f"--markdown {markdown} already exists; pass --force to replace it (the old one is then kept as "
            f"{markdown.name}{BACKUP_INFIX}<time>), or --resume with the --results file it renders to go on "
            "from its rows"
        )))  # fmt: skip
    return replaced


def _held(path: Path) -> str:
    """` (N model_types)` of a compat results file, for the refusal; empty when it is not one."""
    try:
        table = json.loads(path.read_text())
        return f" ({len(table['rows']) + len(table['not_probed'])} model_types)"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def write_tables(result: dict, *, markdown: Path | None, results: Path | None, header: str) -> None:
    """The results file (the --json table) and the Markdown, each replaced atomically."""
    if results is not None:
        atomic_write_text(results, json.dumps(result, indent=1) + "\n")
    if markdown is not None:
        atomic_write_text(markdown, render_markdown(result, header=header))
