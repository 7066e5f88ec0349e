"""Test-wide settings: never auto-load an installed TPU backend, never reach a model hub."""

import os
import tempfile

import pytest

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the CPU peak kept across runs (titan_core.runtime.cpu_peak) goes to a folder of this test session, not ~/.cache
os.environ.setdefault("TITAN_CORE_CACHE_DIR", tempfile.mkdtemp(prefix="titan-core-cache-"))
# torch.compile's kernels too: a shared cache that a killed compile left a truncated .so in would
# fail this session's compile rungs ("file too short"), and this session's climbs compile side by side
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cache-"))
# every process of the suite (a pytest-xdist worker, a climb, a rank, a CLI run) on one intra-op thread unless
# its recipe sets device.threads: set before any of them imports torch. The suite keeps both cores busy, and
# OpenMP threads sharing a core with another process wait on each other at every parallel region (the demo's
# climb beside the suite: 450 CPU-s at torch's default of 2 threads, 231 at 1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    # a test process multiplies bf16 as a process that has built a bf16 Trainer does (titan_core/runtime/
    # cpu_bf16.py), whichever test ran first in it: no bf16 result depends on the order xdist hands tests out
    # (test_cpu_bf16.py compares both ways explicitly, and a fresh process's own choice)
    from titan_core.runtime import cpu_bf16  # lazy: after the settings above, before any test imports torch

    cpu_bf16.enable()


# ---- the whole-ladder climbs, in the background (tests/background.py) ----------------------
def _job_of(item) -> str | None:
    import background  # lazy: after the settings above, which the climbs' processes inherit

    return next((name for name, job in background.JOBS.items() if item.nodeid == job.test), None)


def pytest_collection_modifyitems(session, config, items):
    """The climbs' tests run last (in background.JOBS order): each climbs beside every other test.

    Under pytest-xdist (`make test` runs two workers) they come first instead, each a unit of its own
    (tests/xdist_units.py), so that each worker starts one early."""
    import background

    last = {name: [i for i in items if _job_of(i) == name] for name in background.JOBS}
    rest = [i for i in items if _job_of(i) is None]
    climbs = [i for name in background.JOBS for i in last[name]]
    items[:] = climbs + rest if background.xdist_worker() else rest + climbs


@pytest.hookimpl(optionalhook=True)  # a session without pytest-xdist installed has no such hook
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scope scheduler over tests/xdist_units.py's units, handed out in collection order
    (make test passes --no-loadscope-reorder)."""
    from xdist.scheduler import LoadScopeScheduling  # lazy: only a session with workers has it loaded

    import xdist_units

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_units.unit_of(nodeid)

    return Units(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked whole_machine runs with the climbs paused (background.pause_all), its fixtures too."""
    import background

    wants = item.get_closest_marker("whole_machine") is not None
    if wants:
        background.pause_all()
    yield
    if wants and (nextitem is None or nextitem.get_closest_marker("whole_machine") is None):
        background.resume_all()


def pytest_collection_finish(session):
    """Start each climb whose test will run, as soon as that is known (not for --collect-only)."""
    import background

    if session.config.option.collectonly or background.xdist_worker():
        return  # under pytest-xdist a climb starts in its own test (background.started)
    for name in dict.fromkeys(filter(None, map(_job_of, session.items))):
        background.start(name, shared=len(session.items) > 1)


def pytest_sessionfinish(session, exitstatus):
    import background

    background.stop_all()  # a session that ended before a climb's test (-x, Ctrl-C)
    if exitstatus == 0:
        background.clean_all()
