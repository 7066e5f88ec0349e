"""`onboard skill install`: put the onboard-model skill where a coding agent loads it.

claude: the skill folder goes to `<dir>/.claude/skills/onboard-model/` (Claude Code loads
project skills from there). codex / generic: those agents read AGENTS.md, so the folder
goes to `<dir>/.agents/skills/onboard-model/` and AGENTS.md gets a marked section naming
it; re-installing replaces the section and the folder, never anything else.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import yaml

from onboard.errors import BadInput
from onboard.workspace.fsutil import atomic_write_text
from onboard.workspace.resources import data_dir

SKILL = "onboard-model"
AGENTS = ("claude", "codex", "generic")
BEGIN = f"<!-- {SKILL} skill: begin (written by `onboard skill install`; re-run it to update) -->"
END = f"<!-- {SKILL} skill: end -->"


def skill_source() -> Path:
    src = data_dir("skills") / SKILL
    if not (src / "SKILL.md").is_file():
        raise BadInput(f"the onboard installation has no {SKILL} skill at {src}")
    return src


def frontmatter(skill_md: Path) -> dict:
    text = skill_md.read_text()
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    if not m:
        raise BadInput(f"{skill_md} has no YAML frontmatter")
    return yaml.safe_load(m.group(1)) or {}


def _copy_tree(src: Path, dest: Path) -> None:
    """Replace `dest` with a copy of `src` via a temp folder, so a failure leaves the old copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        shutil.copytree(src, tmp / dest.name, ignore=shutil.ignore_patterns("__pycache__"))
        if dest.exists():
            shutil.rmtree(dest)
        (tmp / dest.name).rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _agents_section(rel_skill: str, description: str) -> str:
    return "\n".join(
        [
            BEGIN,
            f"## Skill: {SKILL}",
            "",
            description.strip(),
            "",
            f"When that applies, read `{rel_skill}/SKILL.md` and follow it; its `references/` folder",
            "holds the per-rung symptom -> cause -> fix guides.",
            END,
        ]
    )


def install(agent: str, base: Path) -> dict:
    """Install the skill for `agent` under `base`; returns what was written."""
    if agent not in AGENTS:
        raise BadInput(f"--agent must be one of {', '.join(AGENTS)}, got '{agent}'")
    base = Path(base)
    if not base.is_dir():
        raise BadInput(f"--dir {base} is not a folder")
    src = skill_source()
    if agent == "claude":
        dest = base / ".claude" / "skills" / SKILL
        _copy_tree(src, dest)
        return {"agent": agent, "skill_dir": str(dest), "agents_md": None}
    dest = base / ".agents" / "skills" / SKILL
    _copy_tree(src, dest)
    agents_md = base / "AGENTS.md"
    section = _agents_section(str(dest.relative_to(base)), frontmatter(src / "SKILL.md").get("description", ""))
    text = agents_md.read_text() if agents_md.is_file() else ""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + section + "\n"
    atomic_write_text(agents_md, text)
    return {"agent": agent, "skill_dir": str(dest), "agents_md": str(agents_md)}
