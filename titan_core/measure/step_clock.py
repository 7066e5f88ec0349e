"""One step's time without making the host wait for the device at that step.

    lap = start_lap(device)   # before the step's work is queued
    ...                       # the step
    lap.stop()                # after it is queued
    lap.seconds()             # once the host has read a value the step computed

An accelerator runs the work the host queues while the host goes on queuing the next
step; waiting for it at every step (to read a clock after the work) stops that overlap. So
the time is taken where the work happens:

- `host`: a CPU runs each op before the call returns, so the host's clock brackets the work;
- `events`: a device with timing events (CUDA, ROCm) records one into its queue at each end
  of the step; their interval is read after the trainer's next read of the device's values,
  when both have long passed, so reading them waits for nothing;
- `sync`: a device without timing events is waited for at both ends of the step: its time
  stays exact, and those steps do not overlap.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import torch

from titan_core.runtime import devices


@functools.cache
def timing_kind(device: torch.device) -> str:
    """How steps on `device` are timed: host | events | sync (see the module docstring)."""
    if device.type == "cpu":
        return "host"
    try:
        torch.Event(device=device, enable_timing=True).record()
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return "sync"
    return "events"


def _mark(kind: str, device: torch.device) -> Any:
    if kind == "events":
        event = torch.Event(device=device, enable_timing=True)
        event.record()
        return event
    if kind == "sync":
        devices.synchronize(device)
    return time.perf_counter()


@dataclass
class Lap:
    """The interval of one step on its device."""

    kind: str
    """timing_kind of the device."""
    device: torch.device
    begin: Any
    """A host clock reading (seconds) or a recorded torch.Event."""
    end: Any = None
    """Like `begin`, set by `stop`."""

    def stop(self) -> None:
        self.end = _mark(self.kind, self.device)

    def seconds(self) -> float:
        """The step's time; for `events`, call it after a read of the step's values (else it waits here)."""
        if self.end is None:
            raise RuntimeError("a lap is read after stop()")
        if self.kind == "events":
            self.end.synchronize()
            return self.begin.elapsed_time(self.end) / 1e3  # milliseconds
        return self.end - self.begin


def start_lap(device: torch.device) -> Lap:
    kind = timing_kind(device)
    return Lap(kind, device, _mark(kind, device))
