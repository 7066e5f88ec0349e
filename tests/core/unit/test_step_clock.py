"""A step's time per device kind: the host clock on a CPU, timing events read later where the
device has them, a wait at both ends where it has none."""

from __future__ import annotations

import time

import pytest
import torch

from titan_core.measure import step_clock
from titan_core.runtime import devices


@pytest.fixture(autouse=True)
def _fresh_kinds():
    step_clock.timing_kind.cache_clear()
    yield
    step_clock.timing_kind.cache_clear()


class FakeEvent:
    """A timing event on a device queue that runs 2 ms behind the host."""

    def __init__(self, device=None, enable_timing=False):
        assert enable_timing
        self.at = None
        self.synced = False

    def record(self):
        self.at = time.perf_counter() + 0.002

    def synchronize(self):
        self.synced = True

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as torch's


def test_a_cpu_step_is_timed_by_the_host_clock_without_a_wait(monkeypatch):
    waits = []
    monkeypatch.setattr(devices, "synchronize", waits.append)
    lap = step_clock.start_lap(torch.device("cpu"))
    time.sleep(0.01)
    lap.stop()
    assert lap.kind == "host" and 0.01 <= lap.seconds() < 1.0 and waits == []


def test_a_device_with_timing_events_is_timed_on_its_queue(monkeypatch):
    monkeypatch.setattr(torch, "Event", FakeEvent)
    waits = []
    monkeypatch.setattr(devices, "synchronize", waits.append)
    lap = step_clock.start_lap(torch.device("meta"))
    time.sleep(0.01)
    lap.stop()
    assert lap.kind == "events" and waits == []  # nothing waits while the steps are queued
    seconds = lap.seconds()
    assert lap.end.synced and 0.01 <= seconds < 1.0
    assert seconds == pytest.approx(lap.end.at - lap.begin.at)


def test_a_device_without_timing_events_is_waited_for_at_both_ends(monkeypatch):
    waits = []
    monkeypatch.setattr(devices, "synchronize", waits.append)
    meta = torch.device("meta")  # torch has no events for it
    lap = step_clock.start_lap(meta)
    lap.stop()
    assert lap.kind == "sync" and waits == [meta, meta] and lap.seconds() >= 0
    with pytest.raises(RuntimeError, match="after stop"):
        step_clock.start_lap(meta).seconds()
