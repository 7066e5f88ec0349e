"""The rung table says which recipe keys a passed gate of each rung may write (`earns`): the
engine applies a rung's recipe edits only within them, so a rung cannot decide what the table
does not give it (a bug there fails the attempt and leaves recipe.toml as it was)."""

import dataclasses

from onboard.engine.next_step import next_step
from onboard.ladder.contract import RecipeEdit, RungResult
from onboard.ladder.table import TABLE
from test_os_errors import Score, attempts, fake_specs, ws  # noqa: F401 -- the fixture


class Editing:
    """A fake eager rung that passes its gate and asks for recipe edits."""

    def __init__(self, *edits: RecipeEdit):
        self.edits = list(edits)

    def run(self, ctx):
        return RungResult(measurements=Score(score=2.0), files_read=[ctx.workspace.recipe_path], command="fake",
                          recipe_edits=self.edits)  # fmt: skip


def test_an_edit_outside_the_rungs_earns_fails_the_attempt_and_leaves_the_recipe(ws):
    assert not TABLE["eager"].earns  # the eager rung earns nothing
    before = ws.recipe_path.read_bytes()
    outcome = next_step(ws, specs=fake_specs(Editing(RecipeEdit("training.steps", 3, "why not"))))
    assert outcome.status == "failed"
    assert "the eager rung may write no recipe key, not training.steps" in outcome.to_json()["error"]
    assert ws.recipe_path.read_bytes() == before
    [entry] = attempts(ws)
    assert entry["status"] == "failed" and entry.get("recipe_edit") is None and "may write no recipe key" in entry["error"]


def test_an_edit_the_rung_earns_is_written(ws, monkeypatch):
    monkeypatch.setitem(TABLE, "eager", dataclasses.replace(TABLE["eager"], earns=frozenset({"training.*"})))
    outcome = next_step(ws, specs=fake_specs(Editing(RecipeEdit("training.steps", 3, "a test"))))
    assert outcome.status == "passed", outcome.message
    assert "steps = 3" in ws.recipe_path.read_text()
    assert attempts(ws)[0]["recipe_edit"]["edits"][0]["key"] == "training.steps"
