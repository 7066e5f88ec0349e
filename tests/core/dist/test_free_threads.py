"""device.adapt_threads: a run takes the cores other processes leave free at its start; a recipe without
it warns when its threads would share busy cores. The probe is scripted (a LoadSnapshot pair), so the
machine's own load cannot decide a test."""

from __future__ import annotations

import pytest
from _cases import tiny_cfg

from titan_core.runtime import cpu_load
from titan_core.runtime.cpu_load import LoadSnapshot
from titan_core.training import trainer as trainer_module
from titan_core.training.trainer import Trainer


def _probe(foreign: float, cores: int = 2, wall: float = 1.0):
    """Two snapshots a `wall` apart on `cores` cores of which other processes held `foreign`."""
    before = LoadSnapshot(wall_s=10.0, busy_s=100.0, cores=cores, tick_s=0.01, own_s=5.0, load_1m=1.0)
    after = LoadSnapshot(wall_s=10.0 + wall, busy_s=100.0 + foreign * wall, cores=cores, tick_s=0.01, own_s=5.0,
                         load_1m=1.0)  # fmt: skip
    return iter([before, after]).__next__


def test_free_cores_are_ours_less_what_other_processes_hold():
    assert cpu_load.free_cores(probe=_probe(0.9), sleep=lambda s: None) == pytest.approx(1.1)
    assert cpu_load.free_cores(probe=_probe(3.0), sleep=lambda s: None) == 0.0
    no_stat = LoadSnapshot(wall_s=10.0, busy_s=None, cores=0, tick_s=0.01, own_s=5.0, load_1m=None)
    assert cpu_load.free_cores(probe=iter([no_stat, no_stat]).__next__, sleep=lambda s: None) is None


def test_threads_for_takes_the_free_cores_rounded_at_least_one():
    assert cpu_load.threads_for(2, 1.1) == 1
    assert cpu_load.threads_for(2, 1.6) == 2
    assert cpu_load.threads_for(4, 0.2) == 1
    assert cpu_load.threads_for(4, None) == 4  # unknown: the recipe's count
    assert cpu_load.threads_for(1, 0.0) == 1


def _trainer(tmp_path, monkeypatch, free: float, *extra: str, quiet: bool = False):
    calls = []

    def free_cores():
        calls.append(1)
        return free

    monkeypatch.setattr(trainer_module.cpu_load, "free_cores", free_cores)
    t = Trainer(tiny_cfg("llama3", tmp_path, "--device.threads=2", *extra), quiet=quiet)
    t.close()
    return t, calls


def test_adapt_threads_runs_with_the_free_cores_and_says_so(tmp_path, monkeypatch, capfd):
    t, _ = _trainer(tmp_path, monkeypatch, 1.1, "--device.adapt_threads=true")
    assert t.threads == 1
    assert "device: 1 intra-op thread, not 2: other processes leave 1.1 of this process's cores free now" in (
        capfd.readouterr().err)
    t, _ = _trainer(tmp_path, monkeypatch, 1.8, "--device.adapt_threads=true")
    assert t.threads == 2 and "intra-op" not in capfd.readouterr().err


def test_without_adapt_the_recipe_keeps_its_threads_and_warns_when_cores_are_busy(tmp_path, monkeypatch, capfd):
    t, calls = _trainer(tmp_path, monkeypatch, 0.9)
    assert t.threads == 2 and calls
    err = capfd.readouterr().err
    assert "warning: device.threads = 2 assumes 2 idle cores, but other processes leave 0.9 free now" in err
    assert "device.adapt_threads = true" in err
    # a quiet trainer (a rung's, a benchmark's) does not measure the machine at all
    t, calls = _trainer(tmp_path, monkeypatch, 0.9, quiet=True)
    assert t.threads == 2 and not calls and "warning" not in capfd.readouterr().err
