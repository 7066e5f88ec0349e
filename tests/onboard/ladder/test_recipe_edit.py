"""Recipe edits by a passed rung: line edits that keep the person's comments, checked by reading
the file back, written atomically; and the edit chain that keeps earlier rungs from going stale
over an edit a gate proved of keys they do not read, while an edit of a key they read, or any
hand edit, makes them stale."""

from __future__ import annotations

import tomllib

import pytest

from onboard.ladder import recipe_edit
from onboard.workspace.fsutil import sha256_file
from onboard.workspace.ledger import Ledger
from onboard.ladder.recipe_edit import RecipeEditError, apply_edits, edit_text, toml_value
from onboard.ladder.contract import RecipeEdit
from onboard.workspace.layout import Workspace

RECIPE = """\
# my recipe: these comments must survive
[model]
family = "llama3"  # chosen by hand

[kernels]
# the loss I want
loss = "plain"  # old reason
ce_chunk = 512

[device]
type = "cpu"
"""


def test_replace_keeps_every_other_line_and_comment():
    new = edit_text(RECIPE, [RecipeEdit("kernels.loss", "fused_ce", "kernels rung: 2x less memory")])
    old_lines, new_lines = RECIPE.splitlines(), new.splitlines()
    changed = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert len(old_lines) == len(new_lines)
    assert changed == [('loss = "plain"  # old reason', 'loss = "fused_ce"  # kernels rung: 2x less memory')]
    assert tomllib.loads(new)["kernels"] == {"loss": "fused_ce", "ce_chunk": 512}


def test_add_to_a_section_goes_after_its_last_line():
    new = edit_text(RECIPE, [RecipeEdit("kernels.moe", "grouped_mm", "faster")])
    lines = new.splitlines()
    assert lines[lines.index("ce_chunk = 512") + 1] == 'moe = "grouped_mm"  # faster'
    assert lines[lines.index("ce_chunk = 512") + 2] == ""  # the blank line before [device] stays
    assert tomllib.loads(new)["device"] == {"type": "cpu"}


def test_missing_section_is_appended_once_for_several_edits():
    text = '[model]\nfamily = "llama3"\n'
    new = edit_text(text, [RecipeEdit("kernels.loss", "fused_ce", "a"), RecipeEdit("kernels.moe", "dense", "b")])
    assert new == text + '\n[kernels]\nloss = "fused_ce"  # a\nmoe = "dense"  # b\n'


def test_nested_sections_and_every_value_type_read_back():
    text = "[graph_trainer]\nenable = true\n\n[graph_trainer.extra]\nx = 1\n"
    edits = [
        RecipeEdit("graph_trainer.scan_layers", True, "t"),
        RecipeEdit("graph_trainer.extra.y", 2.5e-05, "f"),
        RecipeEdit("kernels.swaps", ["a", 'q"uote\\d'], "list"),
        RecipeEdit("training.steps", 7, "i"),
    ]
    data = tomllib.loads(edit_text(text, edits))
    assert data["graph_trainer"]["scan_layers"] is True and data["graph_trainer"]["extra"] == {"x": 1, "y": 2.5e-05}
    assert data["kernels"]["swaps"] == ["a", 'q"uote\\d'] and data["training"]["steps"] == 7
    assert edit_text(text, edits).splitlines()[1:2] == ["enable = true"]  # [graph_trainer] keeps its line


def test_reason_with_newlines_stays_one_comment_line_and_crlf_is_kept():
    new = edit_text('[kernels]\r\nloss = "plain"\r\n', [RecipeEdit("kernels.loss", "fused_ce", "two\nlines")])
    assert new == '[kernels]\r\nloss = "fused_ce"  # two lines\r\n'


@pytest.mark.parametrize(
    "text, edit, needle",
    [
        # a multi-line value: replacing its first line would leave the rest dangling
        ('[kernels]\nswaps = [\n  "a",\n]\n', RecipeEdit("kernels.swaps", ["b"], "x"), "invalid TOML"),
        # the section exists as an inline table: a [kernels] header would define it twice
        ('kernels = {loss = "plain"}\n', RecipeEdit("kernels.loss", "fused_ce", "x"), "invalid TOML"),
        ("[kernels]\n", RecipeEdit("kernels.loss", {"a": 1}, "x"), "cannot write dict"),
        ("[kernels]\n", RecipeEdit("kernels.z_loss", float("nan"), "x"), "NaN"),
        ("[kernels]\n", RecipeEdit("loss", "fused_ce", "x"), "not 'section.field'"),
        ("[kernels\n", RecipeEdit("kernels.loss", "fused_ce", "x"), "not valid TOML before"),
    ],
)
def test_edits_that_would_not_read_back_raise(text, edit, needle):
    with pytest.raises(RecipeEditError, match=needle):
        edit_text(text, [edit])


def test_a_value_that_reads_back_differently_raises_and_writes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    before = path.read_bytes()
    monkeypatch.setattr(recipe_edit, "toml_value", lambda v: '"something else"')
    with pytest.raises(RecipeEditError, match=r"would read back as 'something else'"):
        apply_edits(path, [RecipeEdit("kernels.loss", "fused_ce", "x")])
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["recipe.toml"]


def test_a_failed_write_leaves_the_original_intact(tmp_path, monkeypatch):
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)

    def no_rename(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("titan_core.runtime.files.os.replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        apply_edits(path, [RecipeEdit("kernels.loss", "fused_ce", "x")])
    assert path.read_text() == RECIPE and [p.name for p in tmp_path.iterdir()] == ["recipe.toml"]


def test_apply_edits_records_the_hashes(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    before = sha256_file(path)
    record = apply_edits(path, [RecipeEdit("kernels.loss", "fused_ce", "why")])
    assert record == {
        "sha256_before": before,
        "sha256_after": sha256_file(path),
        "edits": [{"key": "kernels.loss", "value": "fused_ce", "why": "why"}],
    }
    assert record["sha256_before"] != record["sha256_after"]


def test_toml_value():
    assert [toml_value(v) for v in (True, 3, 0.1, float("inf"), "a\tb")] == ["true", "3", "0.1", "inf", '"a\\u0009b"']


# ---- the edit chain: which recipe changes make earlier rungs stale ----------------------------


def _workspace(tmp_path) -> Workspace:
    root = tmp_path / "onboarding" / "w"
    root.mkdir(parents=True)
    Ledger.new(root / "ladder.json", {}).save()
    (root / "recipe.toml").write_text(RECIPE)
    return Workspace.load(tmp_path, "w")


def _record(ws, rung: str, status: str, files_read: dict, recipe_edit: dict | None = None) -> None:
    entry = {"rung": rung, "attempt": 1 + len(ws.ledger.entries(rung)), "status": status, "files_read": files_read}
    if recipe_edit:
        entry["recipe_edit"] = {"file": "recipe.toml", **recipe_edit}
    ws.ledger.append(entry)


def _rung_edit(ws, value: str) -> dict:
    return apply_edits(ws.recipe_path, [RecipeEdit("kernels.loss", value, "rung")])


def NOT_KERNELS(key: str) -> bool:
    """A rung that reads every recipe key but the kernels section."""
    return not key.startswith("kernels.")


def test_a_chain_of_rung_edits_is_no_change_for_a_rung_that_does_not_read_the_keys(tmp_path):
    ws = _workspace(tmp_path)
    eager = ws.hashes([ws.recipe_path])
    _record(ws, "eager", "passed", eager)
    first = _rung_edit(ws, "fused_ce")
    _record(ws, "kernels", "passed", {"recipe.toml": first["sha256_after"]}, first)
    assert ws.changed_files(eager, NOT_KERNELS) == []
    second = _rung_edit(ws, "plain")  # a later passed rung edits again: the chain goes on
    _record(ws, "tuning", "passed", {"recipe.toml": second["sha256_after"]}, second)
    assert ws.changed_files(eager, NOT_KERNELS) == []
    assert ws.changed_files({"recipe.toml": first["sha256_after"]}, NOT_KERNELS) == []


def test_a_rung_edit_of_a_key_a_rung_reads_makes_it_re_verify(tmp_path):
    """The eager rung trains with the recipe's kernels: a kernel the kernels rung kept is a new
    combination eager has not run, so its passed would not describe the recipe any more."""
    ws = _workspace(tmp_path)
    eager = ws.hashes([ws.recipe_path])
    _record(ws, "eager", "passed", eager)
    edit = _rung_edit(ws, "fused_ce")
    _record(ws, "kernels", "passed", {"recipe.toml": edit["sha256_after"]}, edit)
    assert ws.changed_files(eager) == ["recipe.toml"]  # reads every key
    assert ws.changed_files(eager, lambda key: key == "kernels.loss") == ["recipe.toml"]
    assert ws.changed_files(eager, lambda key: key == "compile.enable") == []


def test_a_hand_edit_after_the_rung_edit_is_a_change(tmp_path):
    ws = _workspace(tmp_path)
    eager = ws.hashes([ws.recipe_path])
    _record(ws, "eager", "passed", eager)
    edit = _rung_edit(ws, "fused_ce")
    _record(ws, "kernels", "passed", {"recipe.toml": edit["sha256_after"]}, edit)
    ws.recipe_path.write_text(ws.recipe_path.read_text().replace("ce_chunk = 512", "ce_chunk = 256"))
    assert ws.changed_files(eager, NOT_KERNELS) == ["recipe.toml"]
    assert ws.changed_files({"recipe.toml": edit["sha256_after"]}, NOT_KERNELS) == ["recipe.toml"]


def test_a_hand_edit_before_the_rung_edit_is_a_change(tmp_path):
    ws = _workspace(tmp_path)
    eager = ws.hashes([ws.recipe_path])
    _record(ws, "eager", "passed", eager)
    ws.recipe_path.write_text(ws.recipe_path.read_text().replace("ce_chunk = 512", "ce_chunk = 256"))
    edit = _rung_edit(ws, "fused_ce")  # e.g. a person edited while the rung ran
    _record(ws, "kernels", "passed", {"recipe.toml": edit["sha256_after"]}, edit)
    assert ws.changed_files(eager, NOT_KERNELS) == ["recipe.toml"]


def test_only_passed_attempts_carry_the_chain(tmp_path):
    ws = _workspace(tmp_path)
    eager = ws.hashes([ws.recipe_path])
    edit = _rung_edit(ws, "fused_ce")
    _record(ws, "kernels", "failed", {}, edit)  # never written by the engine; must not count if it were
    assert ws.changed_files(eager, NOT_KERNELS) == ["recipe.toml"]
    ws.recipe_path.unlink()
    _record(ws, "kernels", "passed", {}, edit)
    assert ws.changed_files(eager, NOT_KERNELS) == ["recipe.toml"]  # a deleted recipe is a change, whatever the chain
