"""Every test of tests/core/compile runs with the background climbs paused (`whole_machine`,
tests/conftest.py and tests/background.py).

Capture, tracing and inductor are the suite's most CPU- and cache-bound Python: beside the two
climbs this folder's tests took 203 s, alone 91 s (the same code, fresh clones, pytest's
durations summed). The climbs have minutes to spare (they finished five minutes before the rest
of the suite in the run that measured it), so they wait here and run beside the other folders.
"""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.whole_machine)
