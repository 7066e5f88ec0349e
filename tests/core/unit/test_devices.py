"""Device resolution, peak table, CPU probe."""

import pytest
import torch

from titan_core.runtime import devices
from titan_core.config import ConfigError


def test_auto_resolves_without_tpu():
    dev = devices.resolve_device("auto")
    assert dev.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_unknown_and_unavailable_devices():
    with pytest.raises(ConfigError, match="unknown device"):
        devices.resolve_device("npu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda"):
            devices.resolve_device("cuda")


def test_peak_table_covers_the_promised_chips():
    for chip in ("tpu v5e", "tpu v5p", "tpu v6e", "tpu v7x", "a100", "h100", "h200", "b200"):
        assert 1e14 < devices.PEAK_BF16_FLOPS[chip] < 1e16


def test_cpu_probe_is_positive_and_cached():
    first = devices.peak_flops(torch.device("cpu"), torch.float32)
    assert first > 1e8
    assert devices.peak_flops(torch.device("cpu"), torch.float32) == first  # measured once per process
    before = _resident_bytes()
    block = torch.ones(16 * 2**20)  # 64 MiB, every page written
    # the peak holds what is resident now, in bytes (a KiB-for-bytes slip would be 1024x off)
    assert before + 0.9 * block.numel() * 4 <= devices.peak_memory_bytes(torch.device("cpu")) < 2**50


def _resident_bytes() -> int:
    status = open("/proc/self/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024
