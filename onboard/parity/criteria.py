"""The parity thresholds, read from checklists/parity.yaml, and their evaluation in the test.

The rung's gate (onboard/gates.py) and the workspace's test_parity.py must fail on exactly
the same numbers, so both read the one checklist file; no threshold is written in code.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Measured by the rung around the pytest run, so the test cannot assert it about itself.
RUNG_ONLY_METRICS = frozenset({"pytest_passed"})

_COMPARE = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


def checklist_path() -> Path:
    """checklists/parity.yaml wherever this installation keeps its data."""
    from onboard.resources import data_file

    return data_file("checklists", "parity.yaml")


@dataclass(frozen=True)
class Criterion:
    name: str
    metric: str
    comparator: str
    threshold: Any
    hint: str

    def check(self, measurements: dict[str, Any]) -> tuple[bool, Any]:
        """(ok, value). A missing metric fails, as in the gate: nothing passes unmeasured."""
        value = measurements.get(self.metric)
        if value is None:
            return False, None
        if self.comparator == "is_true":
            return value is True, value
        if isinstance(value, float) and math.isnan(value):
            return False, value
        return bool(_COMPARE[self.comparator](value, self.threshold)), value

    def describe(self, value: Any) -> str:
        bound = "" if self.comparator == "is_true" else f" {self.comparator} {self.threshold!r}"
        return f"{self.name}: {self.metric} = {value!r}, needs{bound or ' true'}\n  hint: {self.hint}"


def load_criteria(path: Path | None = None) -> list[Criterion]:
    """Every machine criterion of the parity checklist."""
    data = yaml.safe_load((path or checklist_path()).read_text())
    out = []
    for item in data["criteria"]:
        comparator = item["comparator"]
        if comparator != "is_true" and comparator not in _COMPARE:
            raise ValueError(f"parity checklist: unknown comparator {comparator!r} in {item['name']}")
        out.append(Criterion(item["name"], item["metric"], comparator, item.get("threshold"), item.get("hint", "")))
    return out


def asserted_criteria() -> list[Criterion]:
    """The criteria the workspace test asserts (all but those only the rung can measure)."""
    return [c for c in load_criteria() if c.metric not in RUNG_ONLY_METRICS]


def threshold(metric: str) -> float:
    """The numeric threshold of the criterion on `metric` (e.g. the localisation tolerance)."""
    for c in load_criteria():
        if c.metric == metric:
            return float(c.threshold)
    raise KeyError(f"parity checklist has no criterion on '{metric}'")
