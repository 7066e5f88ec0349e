"""Fixtures for the ladder tests: a fresh llama3 debugmodel workspace (new-model's own output)."""

import pytest

from narrow import narrow_workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.layout import Workspace


@pytest.fixture
def debug_ws(tmp_path):
    """A workspace from `--preset llama3/debugmodel` under tmp_path; returns the loaded Workspace."""
    plan = plan_workspace("dbg", tmp_path, preset="llama3/debugmodel", device="cpu")
    write_workspace(plan)
    return Workspace.load(tmp_path, "dbg")


@pytest.fixture
def narrow_ws(tmp_path):
    """Factory: a workspace from `--preset <family>/debugmodel` with narrowed config.json,
    seq_len 32 and one thread (narrow.py); returns the loaded Workspace."""
    return lambda family, name=None: narrow_workspace(tmp_path, family, name)
