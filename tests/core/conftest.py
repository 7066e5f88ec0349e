"""tests/core tests titan_core alone: any import of onboard from them fails.

titan_core is installable and usable without onboard, so its tests must be too. A finder on
sys.meta_path refuses `onboard` (and every onboard.* module) whenever a file under tests/core is
on the importing stack, directly or through a helper it imports. Imports made by tests/onboard in
the same session are untouched. A module already imported is served from sys.modules without
asking any finder, so tests/onboard/house/test_structure.py also checks the sources of tests/core
for an onboard import (that check covers function-level imports and the subprocess workers).
"""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path

THIS_FILE = Path(__file__).resolve()
CORE_TESTS = THIS_FILE.parent
REPO = CORE_TESTS.parent.parent

RULE = (
    "tests/core tests titan_core alone and must not import onboard ('{name}' imported from {importer}): "
    "state a bound in tests/core/core_bounds.py, or move the test to tests/onboard"
)


def _core_importer() -> str | None:
    """The innermost file under tests/core on the current stack (this one aside), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = Path(frame.f_code.co_filename)
        if filename.is_relative_to(CORE_TESTS) and filename != THIS_FILE:
            return str(filename.relative_to(REPO))
        frame = frame.f_back
    return None


class NoOnboardFromCore(importlib.abc.MetaPathFinder):
    """Raises ImportError for onboard modules imported (even indirectly) by tests/core files."""

    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] != "onboard":
            return None
        importer = _core_importer()
        if importer is None:
            return None
        raise ImportError(RULE.format(name=name, importer=importer), name=name)


# by name: a second import of this conftest defines a second class, and one finder is enough
if not any(type(f).__name__ == NoOnboardFromCore.__name__ for f in sys.meta_path):
    sys.meta_path.insert(0, NoOnboardFromCore())
