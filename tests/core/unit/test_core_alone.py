"""tests/core/conftest.py's finder refuses onboard to tests/core and to nothing else.

The finder is asked directly: in a whole-suite run tests/onboard has already imported onboard,
and a module in sys.modules is served without asking any finder."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest


def _finder():
    found = [f for f in sys.meta_path if type(f).__name__ == "NoOnboardFromCore"]
    assert len(found) == 1, f"tests/core/conftest.py installs one finder, sys.meta_path has {len(found)}"
    return found[0]


@pytest.mark.parametrize("name", ["onboard", "onboard.ladder.gates"])
def test_onboard_is_refused_from_a_core_test(name):
    rule = r"tests/core tests titan_core alone .*from tests/core/unit/test_core_alone\.py"
    with pytest.raises(ImportError, match=rule):
        _finder().find_spec(name, None)


@pytest.mark.parametrize("name", ["titan_core.train", "onboarding", "onboard_extra"])
def test_other_modules_are_left_to_the_other_finders(name):
    assert _finder().find_spec(name, None) is None


def test_onboard_is_left_alone_outside_tests_core():
    # a worker thread's stack holds no frame of tests/core, as a tests/onboard module importing onboard
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(_finder().find_spec, "onboard.engine", None).result() is None
