"""A ledger entry of a shape no reader can trust (no status, a bad timestamp, not an object):
`list` flags that workspace's ledger as unreadable and lists the others; `status`,
`next-step` and `report` refuse with one line naming the entry and the field; nothing is
written and no gate ever counts the entry as evidence."""

import json

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.errors import BadInput
from onboard.workspace.ledger import Ledger, shape_problem
from onboard.workspace.scaffold import plan_workspace, write_workspace

GOOD = {"rung": "eager", "attempt": 1, "status": "failed", "started": "2026-01-01T00:00:00+00:00",
        "ended": "2026-01-01T00:00:05+00:00", "files_read": {}, "measurements": {}, "criteria": []}  # fmt: skip

# (how the second entry is broken, what the message must name)
CORRUPT = {
    "no status": (
        {k: v for k, v in GOOD.items() if k != "status"} | {"attempt": 2},
        "attempts[1] (eager attempt 2): field 'status' is missing",
    ),
    "bad timestamp": (
        GOOD | {"attempt": 2, "started": "2026-13-45T99:00"},
        "attempts[1] (eager attempt 2): field 'started' is '2026-13-45T99:00', not an ISO 8601",
    ),
    "not an object": (["eager", 2, "passed"], "attempts[1]: the entry is a list, not an object"),
    "no utc offset": (
        GOOD | {"attempt": 2, "ended": "2026-01-01T00:00:05"},
        "field 'ended' is '2026-01-01T00:00:05', a timestamp with no UTC offset",
    ),
    "unknown status": (
        GOOD | {"attempt": 2, "status": "skipped"},
        "field 'status' is 'skipped', not one of passed, failed, not_applicable, interrupted",
    ),
}


def onboard(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


@pytest.fixture
def two_workspaces(tmp_path):
    """Workspaces `bad` and `good`; returns a function that breaks bad's ledger one way."""
    for name in ("bad", "good"):
        write_workspace(plan_workspace(name, tmp_path, preset="llama3/debugmodel", device="cpu"))
    path = tmp_path / "onboarding/bad/ladder.json"

    def corrupt(entry) -> bytes:
        data = json.loads(path.read_text())
        data["attempts"] += [GOOD, entry]
        path.write_text(json.dumps(data, indent=2))
        return path.read_bytes()

    return corrupt


@pytest.mark.parametrize("how", CORRUPT)
def test_list_flags_the_unreadable_ledger_and_lists_the_others(tmp_path, two_workspaces, how):
    entry, needle = CORRUPT[how]
    two_workspaces(entry)
    result = onboard("list", "--dir", tmp_path, "--json")
    assert result.exit_code == 0, result.stderr
    bad, good = json.loads(result.stdout)["workspaces"]
    assert (bad["workspace"], bad["status"]) == ("bad", "unreadable")
    assert needle in bad["error"] and bad["ledger"] == str(tmp_path / "onboarding/bad/ladder.json")
    assert good["workspace"] == "good" and good["rungs"]["eager"] == "pending"
    text = onboard("list", "--dir", tmp_path)
    assert text.exit_code == 0
    assert "unreadable ledger" in text.stdout and needle in " ".join(text.stdout.split())
    assert "next: run eager" in text.stdout  # the good workspace's row is there too


@pytest.mark.parametrize("how", CORRUPT)
def test_status_refuses_in_one_line_naming_the_entry_and_the_field(tmp_path, two_workspaces, how):
    entry, needle = CORRUPT[how]
    two_workspaces(entry)
    result = onboard("status", "bad", "--dir", tmp_path)
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'onboarding/bad/ladder.json'}: ") and needle in line
    assert "fix or remove that entry" in line
    as_json = onboard("status", "bad", "--dir", tmp_path, "--json")
    assert as_json.exit_code == 2
    data = json.loads(as_json.stdout)
    assert data["exit_code"] == 2 and needle in data["error"]
    assert onboard("status", "good", "--dir", tmp_path, "--json").exit_code == 0


@pytest.mark.parametrize(
    "command", [("next-step", "bad"), ("report", "bad"), ("waive", "bad", "eager", "loss_falls", "--why", "x")]
)
def test_no_command_runs_on_or_rewrites_a_malformed_ledger(tmp_path, two_workspaces, command):
    # a forged passed entry with no status field: never evidence, never silently dropped
    before = two_workspaces({k: v for k, v in GOOD.items() if k != "status"} | {"attempt": 2, "passed": True})
    result = onboard(*command, "--dir", tmp_path)
    assert result.exit_code == 2
    assert "field 'status' is missing" in result.stderr.strip().splitlines()[-1]
    bad = tmp_path / "onboarding/bad"
    assert (bad / "ladder.json").read_bytes() == before
    assert not (bad / "runs").exists() and not (bad / "REPORT.md").exists()


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"attempts": [GOOD | {"attempt": 0}]}, "field 'attempt' is 0, not a whole number >= 1"),
        ({"attempts": [GOOD | {"attempt": True}]}, "field 'attempt' is True, not a whole number"),
        ({"attempts": [GOOD | {"measurements": [1, 2]}]}, "field 'measurements' is a list, not an object"),
        ({"attempts": [GOOD | {"criteria": [{"name": "x"}]}]}, "field 'criteria[0]' is not an object with a 'name'"),
        ({"attempts": [GOOD | {"files_read": {"recipe.toml": 3}}]}, "holds a number for 'recipe.toml'"),
        ({"attempts": [GOOD | {"recipe_edit": {"edits": "kernels.loss"}}]}, "field 'recipe_edit.edits'"),
        ({"attempts": [GOOD | {"rung": 7}]}, "attempts[0]: field 'rung' is 7, not a rung name"),
        ({"attempts": [], "waivers": [{"rung": "eager", "criterion": "c", "why": "w"}]}, "waivers[0]: field 'time'"),
        (
            {"attempts": [], "waivers": [{"rung": "eager", "criterion": "c", "why": "w", "time": "soon"}]},
            "waivers[0]: field 'time' is 'soon', not an ISO 8601 timestamp",
        ),
        ({"attempts": [], "waivers": ["eager/c"]}, "waivers[0]: the entry is a string, not an object"),
        ({"attempts": [], "workspace": []}, "'workspace' is a list, not an object"),
    ],
)
def test_shape_problem_names_the_place_and_the_field(tmp_path, data, needle):
    assert needle in shape_problem(data)
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps({"format": 1, **data}))
    with pytest.raises(BadInput, match="ladder.json: ") as info:
        Ledger.load(path)
    assert needle in str(info.value)


def test_sound_ledgers_have_no_shape_problem(tmp_path):
    interrupted = GOOD | {"attempt": 2, "status": "interrupted", "ended": None, "error": None}
    waiver = {"rung": "eager", "criterion": "c", "why": "w", "time": "2026-01-01T00:00:00+00:00", "by": "me"}
    assert (
        shape_problem(
            {"attempts": [GOOD, interrupted, {"rung": "eager", "attempt": 3, "status": "failed"}], "waivers": [waiver]}
        )
        is None
    )
