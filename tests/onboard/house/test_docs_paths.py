"""docs/DESIGN.md and docs/LAYOUT.md name only what exists: every file path, every bare file name and
every dotted module of titan_core or onboard they mention is in the repository (a stale path is a claim
the code no longer holds). A workspace's own files (recipe.toml, ladder.json, ...) are not the repository's
and are listed here once; a name with a placeholder (`<rung>`, `*`) must match at least one file."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ("docs/DESIGN.md", "docs/LAYOUT.md")

WORKSPACE_FILES = frozenset({
    "config.json", "twin.json", "recipe.toml", "adapter.py", "model.py", "test_parity.py", "ladder.json",
    "measurements.json", "metrics.jsonl", "REPORT.md", "report.html", "*.png", "recipe.<kind>-<count>.toml",
    "runs/<rung>/attempt-<N>/measurements.json", "path/to/config.json", "tokenizer.json", "tokenizer_config.json",
})  # fmt: skip
"""What a workspace or a user's checkpoint holds: named by the docs, never files of this repository."""

PATH = re.compile(r"(?<![\w<>*./-])([\w<>*.-]+(?:/[\w<>*.-]+)*\.(?:py|yaml|md|toml|jsonl?|j2|png|html))\b")
MODULE = re.compile(r"\b((?:titan_core|onboard)(?:\.\w+)+)")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if (ROOT / p).exists()]


def missing_paths(text: str, files: list[str]) -> list[str]:
    """Each path-like name in `text` that no tracked file is (or ends with, or matches as a pattern)."""
    bad = []
    for name in sorted(set(PATH.findall(text))):
        if name in WORKSPACE_FILES:
            continue
        pattern = re.sub(r"<[^>]+>", "*", name)
        if "*" in pattern:
            ok = any(fnmatch.fnmatch(f, pattern) or fnmatch.fnmatch(f, "*/" + pattern) for f in files)
        else:
            ok = any(f == name or f.endswith("/" + name) for f in files)
        if not ok:
            bad.append(name)
    return bad


def missing_modules(text: str) -> list[str]:
    """Each dotted titan_core/onboard name that is neither a module nor a name a module defines."""
    bad = []
    for dotted in sorted(set(MODULE.findall(text))):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:cut])
            source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            if source.is_file():
                rest = parts[cut:]
                if rest and not re.search(rf"^(?:def |class |)({re.escape(rest[0])})\b", source.read_text(), re.M):
                    bad.append(dotted)
                break
        else:
            bad.append(dotted)
    return bad


def test_the_checker_finds_a_stale_path_and_module():
    files = ["onboard/ladder/table.py", "checklists/eager.yaml"]
    text = "see onboard/ladder/table.py, table.py, checklists/<rung>.yaml, ladder.json and plan_check.py"
    assert missing_paths(text, files) == ["plan_check.py"]
    assert missing_modules("onboard.ladder.table.TABLE and onboard.nowhere and titan_core.train") == ["onboard.nowhere"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_and_module_the_docs_name_exists(doc):
    text = (ROOT / doc).read_text()
    assert not missing_paths(text, tracked()), f"{doc} names files that do not exist"
    assert not missing_modules(text), f"{doc} names modules that do not exist"


def test_design_lists_every_config_section_in_order():
    """DESIGN section 6 names the trainer's config sections: JobConfig's fields, every one, in its order."""
    from dataclasses import fields

    from titan_core.config.sections import JobConfig

    text = " ".join((ROOT / "docs/DESIGN.md").read_text().split())
    listed = re.search(r"the fields of `JobConfig` \(titan_core/config/sections\.py\) in its order: ([\w, ]+);", text)
    assert listed, "docs/DESIGN.md section 6 no longer lists the config sections"
    assert [s.strip() for s in listed.group(1).split(",")] == [f.name for f in fields(JobConfig)]
