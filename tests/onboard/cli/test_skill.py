"""The onboard-model skill against the agent-skills spec, and against the product it describes."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from onboard.ladder.table import RUNGS, TABLE
from onboard.workspace.resources import data_dir

SKILL_DIR = data_dir("skills") / "onboard-model"
SKILL_MD = SKILL_DIR / "SKILL.md"
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
SPEC_FIELDS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}


def split_skill(text: str) -> tuple[dict, str]:
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert m, "SKILL.md must start with YAML frontmatter between --- lines"
    front = yaml.safe_load(m.group(1))
    assert isinstance(front, dict)
    return front, m.group(2)


FRONT, BODY = split_skill(SKILL_MD.read_text())


def test_frontmatter_follows_the_spec():
    assert set(FRONT) <= SPEC_FIELDS, f"fields outside the spec: {set(FRONT) - SPEC_FIELDS}"
    name = FRONT["name"]
    assert isinstance(name, str) and NAME_RE.fullmatch(name) and len(name) <= 64
    assert name == SKILL_DIR.name == "onboard-model"
    desc = FRONT["description"]
    assert isinstance(desc, str) and 1 <= len(desc) <= 1024
    # the description says what it does and when to use it
    assert "onboard" in desc and re.search(r"\bUse (it )?when\b", desc)
    if "compatibility" in FRONT:
        assert 1 <= len(FRONT["compatibility"]) <= 500
    if "metadata" in FRONT:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in FRONT["metadata"].items())


def test_body_is_short_and_every_referenced_file_exists():
    assert len(BODY.splitlines()) < 500
    links = set(re.findall(r"\]\(([^)#\s]+)\)", BODY))
    mentioned = set(re.findall(r"`?((?:references|scripts|evals)/[\w./-]+\.\w+)`?", BODY))
    assert links and mentioned
    for rel in sorted(links | mentioned):
        assert (SKILL_DIR / rel).is_file(), f"SKILL.md refers to {rel}, which does not exist"
        assert rel.count("/") == 1, f"{rel}: references stay one level deep"
    assert {"references/eager.md", "references/parity.md"} <= links


def test_hard_rules_and_loop_are_stated():
    for rule in (
        "Never edit the upstream model",
        "Never edit checklists or thresholds",
        "Never call a rung skipped",
        "Waive only with a person's consent",
    ):
        assert rule in BODY, rule
    for step in ("onboard new-model", "onboard next-step NAME --json", "model.py", "adapter.py", "recipe.toml"):
        assert step in BODY


def test_rung_table_matches_the_engine():
    rows = dict(re.findall(r"^\| \d \| `(\w+)` \|.*\| (built|not built yet) \|$", BODY, re.M))
    assert list(rows) == list(RUNGS)
    for rung, state in rows.items():
        built = TABLE[rung].runner is not None and importlib.util.find_spec(TABLE[rung].runner) is not None
        assert state == ("built" if built else "not built yet"), rung


def test_parity_reference_covers_the_porting_bugs():
    text = (SKILL_DIR / "references" / "parity.md").read_text().lower()
    for topic in (
        "rope layout",
        "rope theta",
        "rope scaling",
        "gqa head order",
        "epsilon",
        "placement",
        "tie_word_embeddings",
        "bias",
        "soft-cap",
        "off by one",
        "qk-norm",
    ):
        assert topic in text, topic
    eager = (SKILL_DIR / "references" / "eager.md").read_text()
    for criterion in ("all_finite", "loss_falls", "step1_loss_near_expected"):
        assert f"## {criterion} fails" in eager


def _script():
    path = SKILL_DIR / "scripts" / "summarise_next_step.py"
    spec = importlib.util.spec_from_file_location("summarise_next_step", path)
    module = importlib.util.module_from_spec(spec)
    # no __pycache__ inside the skill folder: it ships as package data and gets copied by install
    old, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = old
    return module


def test_script_points_only_at_sections_that_exist():
    script = _script()
    parity_heads = set(re.findall(r"^## (.+)$", (SKILL_DIR / "references" / "parity.md").read_text(), re.M))
    eager_heads = set(re.findall(r"^## (.+)$", (SKILL_DIR / "references" / "eager.md").read_text(), re.M))
    named = {s for _, s in script.PARITY_SECTIONS} | set(script.CRITERION_SECTIONS.values())
    named |= {"Block structure", "Only some layers", "Reading a parity failure"}
    assert named <= parity_heads, named - parity_heads
    assert set(script.EAGER_SECTIONS.values()) <= eager_heads
    assert script.parity_section("layers.0.attention") == "Inside attention"
    assert script.parity_section("layers.3.attention.wq") == "Projections and the adapter"
    assert script.parity_section("layers.0.moe.router.gate") == "MoE"
    assert script.parity_section("layers.1") == "Block structure"
    assert script.parity_section("output") == "Output head" and script.parity_section("norm") == "Norms"


def test_script_on_a_real_failed_next_step():
    # evals/files/next_step_parity_failed.json is the --json output of a real failing run
    out = subprocess.run(
        [sys.executable, str(SKILL_DIR / "scripts" / "summarise_next_step.py"),
         str(SKILL_DIR / "evals" / "files" / "next_step_parity_failed.json")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "rung parity, attempt 2: failed" in out
    assert "FAILED logits_rel_l2" in out and "first divergence: layers.0.attention" in out
    assert "read: references/parity.md: Inside attention" in out
    bad = subprocess.run(
        [sys.executable, str(SKILL_DIR / "scripts" / "summarise_next_step.py")],
        input="not json",
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2


def test_evals_are_well_formed():
    data = json.loads((SKILL_DIR / "evals" / "evals.json").read_text())
    assert data["skill_name"] == FRONT["name"]
    ids = [e["id"] for e in data["evals"]]
    assert len(ids) >= 3 and len(set(ids)) == len(ids) and all(isinstance(i, int) for i in ids)
    for case in data["evals"]:
        assert case["prompt"].strip() and case["expected_output"].strip() and case["assertions"]
        for rel in case.get("files", []):
            assert (SKILL_DIR / rel).is_file(), rel


@pytest.mark.parametrize("agent", ["claude", "codex", "generic"])
def test_skill_install_places_the_skill_and_is_idempotent(tmp_path, agent):
    from onboard.cli.skill_install import BEGIN, install

    (tmp_path / "AGENTS.md").write_text("# Project notes\n\nkeep me\n")
    first = install(agent, tmp_path)
    second = install(agent, tmp_path)
    assert first == second
    skill = Path(first["skill_dir"])
    assert (skill / "SKILL.md").read_text() == SKILL_MD.read_text()
    assert (skill / "references" / "parity.md").is_file() and (skill / "scripts" / "summarise_next_step.py").is_file()
    agents = (tmp_path / "AGENTS.md").read_text()
    if agent == "claude":
        assert skill == tmp_path / ".claude" / "skills" / "onboard-model"
        assert BEGIN not in agents
    else:
        assert agents.count(BEGIN) == 1 and agents.startswith("# Project notes\n\nkeep me\n")
        assert FRONT["description"].split()[0] in agents and "SKILL.md" in agents
