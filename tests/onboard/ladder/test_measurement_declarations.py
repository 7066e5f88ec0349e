"""Every metric a checklist names is a declared measurement of its rung, found without running a rung.

Each rung declares its measurements as a dataclass in the rung table (`TABLE[rung].measurements`,
a `onboard.ladder.contract.Measurements`, onboard/ladder/measurements/). A criterion's metric, a threshold reference
(`measurements.<metric>`, `evidence.<rung>.<metric>`, a bare metric name) and a
`measurements.<metric>` or `evidence.<rung>.<metric>` a hint or human check points the reader
to must each name a declared field, so renaming a field (or misspelling a metric) fails here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import yaml

from onboard.ladder.gates import parse_checklist
from onboard.ladder.table import RUNGS, TABLE
from onboard.ladder.contract import ABSENT, Measurements, flattened
from onboard.workspace.resources import data_file

# a reference in prose: measurements.<metric> or evidence.<rung>.<metric>, not a pattern (worst_*_kernel)
PROSE_REF = re.compile(r"\b(?:measurements|evidence\.(\w+))\.(\w+)\b(?![*<])")


def declared_by_rung() -> dict[str, frozenset[str]]:
    return {rung: TABLE[rung].measurements.declared() for rung in RUNGS}


def undeclared(source: str, data: dict, declared: dict[str, frozenset[str]]) -> list[str]:
    """One line per name in the checklist `data` (read from `source`) that its rung does not declare."""
    checklist = parse_checklist(data, source)
    problems = []

    def check(rung: str, name: str, where: str) -> None:
        if rung not in declared:
            problems.append(f"{source}: {where}: evidence of '{rung}', which is not a rung")
        elif name not in declared[rung]:
            problems.append(f"{source}: {where}: '{name}' is not a declared measurement of the {rung} rung")

    for c in checklist.criteria:
        check(checklist.rung, c.metric, f"criterion '{c.name}' (metric)")
        if isinstance(c.threshold, str):
            ref = c.threshold.split(".")
            if ref[0] == "evidence" and len(ref) == 3:
                check(ref[1], ref[2], f"criterion '{c.name}' (threshold {c.threshold})")
            else:
                check(checklist.rung, c.threshold.removeprefix("measurements."), f"criterion '{c.name}' (threshold)")
        for rung, name in PROSE_REF.findall(c.hint):
            check(rung or checklist.rung, name, f"criterion '{c.name}' (hint)")
    for i, line in enumerate(checklist.human):
        for rung, name in PROSE_REF.findall(line):
            check(rung or checklist.rung, name, f"human[{i}]")
    return problems


@pytest.mark.parametrize("rung", RUNGS)
def test_every_metric_a_checklist_names_is_declared(rung):
    path = Path(data_file("checklists", f"{rung}.yaml"))
    assert undeclared(str(path), yaml.safe_load(path.read_text()), declared_by_rung()) == []


def test_a_misspelt_metric_or_reference_fails_with_file_criterion_and_name():
    declared = declared_by_rung()
    data = {
        "rung": "compile",
        "criteria": [
            {"name": "no_graph_breaks", "metric": "graph_brakes", "comparator": "==", "threshold": 0, "hint": "h"},
            {
                "name": "step1_loss",
                "metric": "step1_loss_rel_err",
                "comparator": "<=",
                "threshold": "evidence.eager.step1_los",
                "hint": "see measurements.first_braek",
            },
            {
                "name": "fine",
                "metric": "graph_breaks",
                "comparator": "<=",
                "threshold": "evidence.eager.step1_loss",
                "hint": "measurements.worst_*_kernel is a pattern, never a name",
            },
        ],
    }
    assert undeclared("in-memory.yaml", data, declared) == [
        "in-memory.yaml: criterion 'no_graph_breaks' (metric): 'graph_brakes' is not a declared measurement "
        "of the compile rung",
        "in-memory.yaml: criterion 'step1_loss' (threshold evidence.eager.step1_los): 'step1_los' is not a declared "
        "measurement of the eager rung",
        "in-memory.yaml: criterion 'step1_loss' (hint): 'first_braek' is not a declared measurement of the "
        "compile rung",
    ]


def test_every_rung_declares_a_measurements_dataclass_with_only_absent_defaults():
    """An undeclared name set by a rung raises; an unset field stays out of the ledger's flat dict."""
    for rung in RUNGS:
        cls = TABLE[rung].measurements
        assert issubclass(cls, Measurements), rung
        m = cls()
        assert m.as_metrics() == {}, rung  # nothing measured, nothing recorded
        assert all(f.default is ABSENT for f in fields(cls) if not f.metadata.get("flattened")), rung
    with pytest.raises(TypeError, match="declares no measurement 'graph_brakes'"):
        TABLE["compile"].measurements().graph_brakes = 0


def test_as_metrics_is_the_flat_dict_the_ledger_stores():
    @dataclass(kw_only=True)
    class Two(Measurements):
        done: bool = ABSENT
        """Whether it finished."""
        first: str | None = ABSENT
        """None is a value, recorded; ABSENT is not measured, left out."""
        per_flag: dict = flattened()
        """Names made at run time."""

    m = Two(done=True, first=None, per_flag={"loss_fused_ce_kept": False})
    m.update({"done": False})
    assert m.as_metrics() == {"done": False, "first": None, "loss_fused_ce_kept": False} == dict(m)
    assert Two.declared() == {"done", "first"} and m["first"] is None and "per_flag" not in m
    with pytest.raises(TypeError, match="declares no measurement 'dnoe'"):
        m.update(dnoe=True)
