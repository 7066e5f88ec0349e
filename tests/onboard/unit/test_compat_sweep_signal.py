"""A Ctrl-C stops `onboard compat` whichever of its threads the kernel hands SIGINT to: the sweep's
main thread waits for its probes in short timed waits, so it takes the interrupt even when the
signal landed on a probe's thread (a blocking wait would sleep on until that probe ended)."""

from __future__ import annotations

import importlib
import signal
import threading
import time

import pytest

sweep_mod = importlib.import_module("onboard.compat.sweep")  # the module: the package exports its function `sweep`

pytestmark = pytest.mark.hf


def test_sigint_on_a_worker_thread_interrupts_the_sweep(monkeypatch):
    started, stopped = [], []

    def probe(mt, **kw):
        started.append(mt)
        time.sleep(0.5)  # the main thread is waiting on the probes by now
        # the signal goes to this thread, not the main one, as a process-directed SIGINT may
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        # a probe runs until the sweep stops it (or, were the Ctrl-C lost, for its whole time)
        stopped.append(sweep_mod._STOPPING.wait(timeout=10))
        return {"cells": {}, "seconds": 0.0}

    monkeypatch.setattr(sweep_mod, "run_isolated", probe)
    # Python's own Ctrl-C handler, whatever an earlier test of the session left installed
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    logs = []
    try:
        result = sweep_mod.sweep(["llama", "mistral"], log=logs.append)
    finally:
        signal.signal(signal.SIGINT, before)
    assert stopped == [True]  # the Ctrl-C stopped the probe it came during
    assert started == ["llama"]  # and no probe starts after it
    assert result["interrupted"] == "llama" and result["rows"] == {}
    assert result["remaining"] == ["llama", "mistral"]
    assert "compat: interrupted while probing llama" in logs
