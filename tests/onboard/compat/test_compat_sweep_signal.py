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


def test_an_interrupted_resume_keeps_every_earlier_row_not_only_those_it_reached(monkeypatch):
    """The kept rows past the probe a Ctrl-C stopped stay in the table (and so in the results file)."""
    row = {"cells": {r: {"status": "pass", "reason": "", "seconds": 1.0} for r in sweep_mod.rungs()}, "seconds": 7.0}

    def probe(mt, **kw):
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        sweep_mod._STOPPING.wait(timeout=10)
        return {"cells": {}, "seconds": 0.0}

    monkeypatch.setattr(sweep_mod, "run_isolated", probe)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = {"rows": {"mistral": row, "qwen3": row}, "not_probed": {"xlnet": "not a causal LM"}}
    try:
        result = sweep_mod.sweep(["llama", "mistral", "qwen3", "xlnet"], previous=previous)
    finally:
        signal.signal(signal.SIGINT, before)
    assert result["interrupted"] == "llama"
    assert result["rows"] == {"mistral": row, "qwen3": row} and result["not_probed"] == {"xlnet": "not a causal LM"}
    assert result["remaining"] == ["llama"]
