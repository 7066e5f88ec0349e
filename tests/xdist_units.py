"""The units of work pytest-xdist hands its workers (`make test` runs two; tests/conftest.py's scheduler).

- A whole-ladder climb (tests/background.py's JOBS) is a unit alone, so that each worker starts one early.
- Every test that reads a gloo world (tests/core/dist/_world.py: one launch per world size, for every
  scenario the session collected) is in one unit: a world launched in two workers would run twice.
  `_world.job` refuses a reader outside WORLD_READERS, so this list cannot fall behind.
- Every other file is a unit, so that a module's fixtures (a climbed workspace, a plain reference run)
  are built once.

The scheduler asks by node id alone (the controller collects nothing), so the rule is declared here,
not read from the test modules."""

from __future__ import annotations

import background

WORLD_READERS = ("tests/core/dist/", "tests/core/parallel/", "tests/core/compile/test_graph_trainer_dist.py")
"""Where the tests that read a gloo world live (node id prefixes, from the repository root)."""


def unit_of(nodeid: str) -> str:
    if any(nodeid == job.test for job in background.JOBS.values()):
        return nodeid
    if nodeid.startswith(WORLD_READERS):
        return "gloo worlds"
    return nodeid.split("::")[0]
