"""The parity thresholds, read from checklists/parity.yaml, and their evaluation in the test.

The rung's gate (onboard/ladder/gates.py) and the workspace's test_parity.py must fail on exactly
the same numbers, so both read the one checklist file; no threshold is written in code.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from onboard.ladder import gates
from onboard.workspace.resources import data_file

# Measured by the rung around the pytest run, so the test cannot assert it about itself.
RUNG_ONLY_METRICS = frozenset({"pytest_passed"})


def checklist_path() -> Path:
    """checklists/parity.yaml wherever this installation keeps its data."""
    return data_file("checklists", "parity.yaml")


@dataclass(frozen=True)
class Criterion(gates.Criterion):
    """A gate criterion that the workspace test can assert on its own measurements."""

    def check(self, measurements: dict[str, Any]) -> tuple[bool, Any]:
        """(ok, value), with the gate's own comparison; a missing metric fails, as in the gate, and a
        criterion with nothing to compare (`not_applicable_when`) passes with no value, as in the gate."""
        if self.not_applicable_why(measurements):
            return True, None
        value = measurements.get(self.metric)
        if value is None:
            return False, None
        ok, _ = gates.check_value(self, value, self.threshold)
        return ok, value

    def describe(self, value: Any) -> str:
        """The criterion, what was measured and its bound, and the hint: a failed assertion's message."""
        bound = "" if self.comparator == "is_true" else f" {self.comparator} {self.threshold!r}"
        return f"{self.name}: {self.metric} = {value!r}, needs{bound or ' true'}\n  hint: {self.hint}"


def load_criteria(path: Path | None = None) -> list[Criterion]:
    """Every machine criterion of the parity checklist, parsed by the gate's own loader, every field kept
    (its `not_applicable_when` among them, so the test and the gate judge the same criterion)."""
    checklist = gates.load_checklist("parity", path or checklist_path())
    return [Criterion(**{f.name: getattr(c, f.name) for f in fields(gates.Criterion)}) for c in checklist.criteria]


def asserted_criteria() -> list[Criterion]:
    """The criteria the workspace test asserts (all but those only the rung can measure)."""
    return [c for c in load_criteria() if c.metric not in RUNG_ONLY_METRICS]


def params(path: Path | None = None) -> dict[str, Any]:
    """The checklist's `params:` (the numbers parity runs with, e.g. how features are exercised)."""
    return dict(gates.load_checklist("parity", path or checklist_path()).params)


def threshold(metric: str) -> float:
    """The numeric threshold of the criterion on `metric` (e.g. the localisation tolerance)."""
    for c in load_criteria():
        if c.metric == metric:
            return float(c.threshold)
    raise KeyError(f"parity checklist has no criterion on '{metric}'")
