"""A rung reads top to bottom, and an attempt records it in two whole writes (DESIGN section 4).

- Each rung module names, in its docstring, its checklist (checklists/<rung>.yaml) and the Measurements
  type its run builds (the rung table's), so a reader opening the rung sees all three.
- A rung's record is built once by keyword (`Measurements.from_parts`): the parts its helpers measured
  are records of the same type (or a base), a field measured twice or a part of another rung's type
  raises, and so does a misspelt keyword.
- An attempt writes ladder.json twice, each time a whole entry: the `interrupted` placeholder before the
  rung runs, then the entry it built (or, for bad input, none).
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from onboard.engine.next_step import next_step
from onboard.errors import BadInput
from onboard.ladder.contract import ABSENT, RungResult
from onboard.ladder.measurements.training_measurements import (
    BesideEager, CompileMeasurements, EagerMeasurements, SteadyRun,
)  # fmt: skip
from onboard.ladder.table import RUNGS, TABLE
from onboard.workspace import ledger as ledger_file
from onboard.workspace.layout import Workspace
from test_os_errors import Score, fake_specs, ws  # noqa: F401 -- the fake eager rung's record, its specs, the fixture


@pytest.mark.parametrize("rung", RUNGS)
def test_each_rung_module_names_its_checklist_and_its_measurements(rung):
    declared = TABLE[rung]
    source = Path(importlib.util.find_spec(declared.runner).origin)  # found, not imported: no torch here
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    assert f"checklists/{rung}.yaml" in doc, source
    assert declared.measurements.__name__ in doc, source


def test_a_record_is_built_once_from_parts_of_its_own_type():
    steady = SteadyRun(step_time_median_s=0.1, peak_mem_bytes=5)
    beside = BesideEager(vs_eager_context="context", speedup_vs_eager=2.0)
    m = CompileMeasurements.from_parts(steady, beside, CompileMeasurements(graph_breaks=0), steps_run=3)
    assert m.as_metrics() == {"step_time_median_s": 0.1, "peak_mem_bytes": 5, "speedup_vs_eager": 2.0,
                              "vs_eager_context": "context", "steps_run": 3, "graph_breaks": 0}  # fmt: skip
    with pytest.raises(TypeError, match="step_time_median_s measured by a part and given again"):
        CompileMeasurements.from_parts(steady, step_time_median_s=0.2)
    with pytest.raises(TypeError, match="peak_mem_bytes measured by two parts"):
        CompileMeasurements.from_parts(steady, SteadyRun(peak_mem_bytes=6))
    with pytest.raises(TypeError, match="not made of a EagerMeasurements"):
        CompileMeasurements.from_parts(EagerMeasurements(steps_run=3))
    with pytest.raises(TypeError, match="graph_brakes"):  # a misspelt keyword fails at construction
        CompileMeasurements.from_parts(steady, graph_brakes=0)
    assert CompileMeasurements.from_parts(SteadyRun(steady_from=ABSENT)).as_metrics() == {}  # not measured


# ---- the ledger's two writes -------------------------------------------------------------------
class Rung:
    """A rung that reads the ledger file as it runs (what a kill would leave), then returns or raises."""

    def __init__(self, ws: Workspace, error: Exception | None = None):
        self.ws, self.error, self.seen = ws, error, None

    def run(self, ctx):
        self.seen = json.loads(self.ws.ledger.path.read_text())["attempts"]
        if self.error is not None:
            raise self.error
        return RungResult(measurements=Score(score=2.0), files_read=[ctx.workspace.recipe_path], command="fake")


@pytest.fixture
def writes(monkeypatch) -> list[dict]:
    """Each ladder.json the ledger writes, as JSON."""
    real, out = ledger_file.atomic_write_text, []

    def counted(path, text):
        out.append(json.loads(text))
        real(path, text)

    monkeypatch.setattr(ledger_file, "atomic_write_text", counted)
    return out


def test_an_attempt_writes_its_placeholder_then_its_whole_entry(ws, writes):
    rung = Rung(ws)
    outcome = next_step(ws, specs=fake_specs(rung))
    assert outcome.status == "passed"
    [placeholder] = rung.seen  # what the file held while the rung ran
    assert (placeholder["status"], placeholder["ended"], placeholder["measurements"]) == ("interrupted", None, {})
    assert len(writes) == 2  # the placeholder, then the entry: nothing in between
    assert writes[0]["attempts"] == [placeholder]
    [entry] = writes[1]["attempts"]
    assert (entry["status"], entry["measurements"], entry["command"]) == ("passed", {"score": 2.0}, "fake")
    assert entry["started"] == placeholder["started"] and entry["ended"] and entry["criteria"][0]["ok"]


def test_bad_input_withdraws_the_placeholder_in_the_second_write(ws, writes):
    with pytest.raises(BadInput, match="no such recipe key"):
        next_step(ws, specs=fake_specs(Rung(ws, BadInput("no such recipe key"))))
    assert len(writes) == 2 and [e["status"] for e in writes[0]["attempts"]] == ["interrupted"]
    assert writes[1]["attempts"] == []
