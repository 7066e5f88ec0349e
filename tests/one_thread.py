"""One intra-op thread for a test that runs torch in this process (torch.set_num_threads, given back
after the test), whatever an earlier test of the process left. The processes a test starts inherit
tests/conftest.py's OMP_NUM_THREADS=1 (unless the session sets its own).

The tests' models are toys: a second thread gains them nothing, and on a busy 2-core machine it spins
at every parallel region waiting for a core another process holds (measured here: the same tests took
1.5-7x the CPU with torch's default of one thread per core). No test that imports this checks a thread
count. A test module opts in by importing the fixture, which is autouse:

    from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread)

Imported by tests (tests/ is on the path: its conftest.py).
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
