"""tests/core/core_bounds.py states the checklist numbers titan_core's tests use (tests/core runs
without onboard); each must equal its checklist entry as onboard's one reader parses it, so a
change to a checklist moves both or fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from onboard.ladder.gates import load_checklist

BOUNDS_FILE = Path(__file__).resolve().parents[2] / "core" / "core_bounds.py"


def _bounds():
    spec = importlib.util.spec_from_file_location("core_bounds_under_test", BOUNDS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BOUNDS = _bounds()


def checklist_value(rung: str, kind: str, entry: str):
    checklist = load_checklist(rung)
    if kind == "param":
        return checklist.param(entry)
    criterion = checklist.criterion(entry)
    assert criterion is not None, f"checklists/{rung}.yaml has no criterion '{entry}'"
    return criterion.threshold


@pytest.mark.parametrize("name", sorted(BOUNDS.SOURCES))
def test_each_core_bound_is_its_checklist_number(name):
    rung, kind, *entries = BOUNDS.SOURCES[name]
    stated = getattr(BOUNDS, name)
    for entry in entries:
        assert stated == checklist_value(rung, kind, entry), (
            f"tests/core/core_bounds.py {name} = {stated!r}, checklists/{rung}.yaml {entry} says "
            f"{checklist_value(rung, kind, entry)!r}: state the checklist's number"
        )


def test_every_stated_bound_names_its_source():
    stated = {n for n in vars(BOUNDS) if n.isupper() and n != "SOURCES"}
    assert stated == set(BOUNDS.SOURCES), f"bounds without a checklist entry: {stated ^ set(BOUNDS.SOURCES)}"
