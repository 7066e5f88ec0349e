"""The CPU peak behind CPU MFU: best probe kept per machine, never lowered by a loaded probe."""

from __future__ import annotations

import json

import pytest
import torch

from titan_core.runtime import cpu_peak


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("TITAN_CORE_CACHE_DIR", str(tmp_path))
    cpu_peak.measured_cpu_peak.cache_clear()
    yield tmp_path
    cpu_peak.measured_cpu_peak.cache_clear()


def _probing(monkeypatch, rate, asked=None):
    def probe(dtype, **kwargs):
        if asked is not None:
            asked.append(kwargs)
        return rate

    monkeypatch.setattr(cpu_peak, "probe", probe)
    cpu_peak.measured_cpu_peak.cache_clear()  # a new process
    return cpu_peak.measured_cpu_peak(torch.float32)


def test_a_loaded_probe_never_lowers_the_kept_peak(fresh, monkeypatch):
    assert _probing(monkeypatch, 100e9) == 100e9
    assert _probing(monkeypatch, 40e9) == 100e9  # another job had the cores: MFU still divides by 100
    assert _probing(monkeypatch, 120e9) == 120e9  # a quieter moment raises it
    data = json.loads((fresh / "cpu_peak.json").read_text())
    (entry,) = data.values()
    assert entry["flops"] == 120e9 and entry["measured"] and "load_1min" in entry
    assert "threads=" in next(iter(data)) and "torch" in next(iter(data))


def test_a_kept_peak_is_only_spot_checked(fresh, monkeypatch):
    """The first process probes in full; one that finds a peak kept probes one short round, which can still
    raise it."""
    asked = []
    assert _probing(monkeypatch, 100e9, asked) == 100e9
    assert _probing(monkeypatch, 90e9, asked) == 100e9
    assert _probing(monkeypatch, 130e9, asked) == 130e9
    assert asked == [{}, cpu_peak.SPOT_CHECK, cpu_peak.SPOT_CHECK]
    (fresh / "cpu_peak.json").write_text("{not json")  # nothing readable kept: a full probe again
    assert _probing(monkeypatch, 7e9, asked) == 7e9 and asked[-1] == {}


def test_a_corrupt_or_unwritable_cache_falls_back_to_the_probe(fresh, monkeypatch):
    (fresh / "cpu_peak.json").write_text("{not json")
    assert _probing(monkeypatch, 7e9) == 7e9
    monkeypatch.setenv("TITAN_CORE_CACHE_DIR", str(fresh / "cpu_peak.json" / "below-a-file"))
    assert _probing(monkeypatch, 5e9) == 5e9


def test_the_real_probe_measures_a_plausible_rate():
    rate = cpu_peak.probe(torch.float32, rounds=2, trials=2)
    assert 1e8 < rate < 1e14


def test_the_probe_grows_its_products_only_while_they_are_fast(monkeypatch):
    """A dtype the CPU runs slowly (bf16 here, ~100x fp32) is probed at a size that takes ~PRODUCT_S
    a product, so a bf16 run's first step does not wait minutes for its MFU denominator."""
    monkeypatch.setattr(cpu_peak, "PRODUCT_S", 0.0)  # every product "slow": the smallest size
    assert cpu_peak.probe_operands(torch.float32)[0] == cpu_peak.MIN_N
    monkeypatch.setattr(cpu_peak, "PRODUCT_S", float("inf"))  # every product "fast": up to N
    n, a, b = cpu_peak.probe_operands(torch.bfloat16)
    assert n == cpu_peak.N and a.shape == b.shape == (n, n) and a.dtype == torch.bfloat16
