"""Fixtures for the ladder tests: a fresh llama3 debugmodel workspace (new-model's own output)."""

import pytest

from onboard.scaffold import plan_workspace, write_workspace
from onboard.workspace import Workspace


@pytest.fixture
def debug_ws(tmp_path):
    """A workspace from `--preset llama3/debugmodel` under tmp_path; returns the loaded Workspace."""
    plan = plan_workspace("dbg", tmp_path, preset="llama3/debugmodel", device="cpu")
    write_workspace(plan)
    return Workspace.load(tmp_path, "dbg")
