"""Device selection, synchronisation, memory statistics and peak FLOP/s.

Nothing here hard-codes a device type outside `resolve_device`: callers pass the
`torch.device` around and use `synchronize`, `peak_memory_bytes` and `peak_flops`.
"""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path

import torch

from titan_core.config.loader import ConfigError
from titan_core.runtime.cpu_peak import measured_cpu_peak

# Dense bf16 peak FLOP/s per chip, from the vendors' published specifications.
PEAK_BF16_FLOPS: dict[str, float] = {
    "tpu v5e": 197e12,  # Google Cloud TPU v5e docs: 197 TFLOP/s bf16 per chip
    "tpu v5p": 459e12,  # Google Cloud TPU v5p docs: 459 TFLOP/s bf16 per chip
    "tpu v6e": 918e12,  # Google Cloud TPU v6e (Trillium) docs: 918 TFLOP/s bf16 per chip
    "tpu v7x": 2307e12,  # Google Ironwood (TPU7x) announcement: 2,307 TFLOP/s bf16 per chip
    "a100": 312e12,  # NVIDIA A100 datasheet: 312 TFLOP/s BF16 tensor core, dense
    "h100": 989e12,  # NVIDIA H100 SXM datasheet: 1,979 TFLOP/s with sparsity -> 989 dense
    "h200": 989e12,  # NVIDIA H200 datasheet: same tensor cores as H100 SXM, 989 dense
    "b200": 2250e12,  # NVIDIA HGX B200 datasheet: 36 PFLOP/s sparse per 8 GPUs -> 2.25 PF dense each
    "mi300x": 1307.4e12,  # AMD Instinct MI300X datasheet: 1,307.4 TFLOP/s BF16 dense
}


def device_type(kind: str) -> str:
    """`auto|cpu|cuda|tpu` as it resolves: `auto` is cuda when available, else cpu (never the TPU: it must be asked for)."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if kind == "auto" else kind


def resolve_device(kind: str, *, local_rank: int = 0, libtpu_init_flags: str = "") -> torch.device:
    """`auto|cpu|cuda|tpu` -> torch.device (`device_type`)."""
    kind = device_type(kind)
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' requested but torch.cuda.is_available() is False on this machine")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if kind == "tpu":
        _init_tpu(libtpu_init_flags)
        return torch.device("tpu", local_rank)
    raise ConfigError(f"unknown device '{kind}' (valid: auto, cpu, cuda, tpu)")


def _init_tpu(libtpu_init_flags: str) -> None:
    """Import torch_tpu only on request: it aborts the process when no TPU is attached.

    LIBTPU_INIT_ARGS must be set before libtpu loads, so the flags go into the environment
    first. TorchTPU runs eagerly by default, which is what eager training and parity checks need.
    """
    if libtpu_init_flags:
        os.environ["LIBTPU_INIT_ARGS"] = (os.environ.get("LIBTPU_INIT_ARGS", "") + " " + libtpu_init_flags).strip()
    try:
        import torch_tpu  # noqa: F401  # lazy: the [tpu] extra; importing it aborts a process with no TPU
    except ImportError:
        raise ConfigError(
            "device 'tpu' requested but torch_tpu is not installed: on a TPU host run pip install 'titan-onboard[tpu]'"
        ) from None


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock timings measure the work itself."""
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the allocator's on accelerators; on Linux CPUs the process's VmHWM.

    Without the CPU reset, a second run in one process (e.g. a comparison of two
    execution modes) would report the larger peak of the two as its own.
    """
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and hasattr(backend, "reset_peak_memory_stats"):
        backend.reset_peak_memory_stats()
    elif device.type == "cpu":
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # Linux: VmHWM := the current resident set size
        except OSError:
            pass  # not Linux, or not allowed: the peak stays the process's lifetime peak


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory; on CPU the process's peak resident set size (since the last reset on Linux)."""
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and hasattr(backend, "max_memory_allocated"):
        return int(backend.max_memory_allocated(device))
    return _cpu_peak_rss()


def _cpu_peak_rss() -> int:
    """This process's peak resident set size.

    VmHWM first: `ru_maxrss` is inherited across fork and exec on Linux, so a rank started
    by a launcher would report its parent's peak instead of its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return platform.processor() or platform.machine()
    return device.type


def peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """Peak FLOP/s for MFU: the vendor table on accelerators; on CPU the best matmul rate seen on
    this machine (titan_core.runtime.cpu_peak), so CPU MFU is indicative, and comparable across runs."""
    if device.type == "cpu":
        return measured_cpu_peak(dtype)
    name = device_name(device).lower()
    for key, flops in PEAK_BF16_FLOPS.items():
        if key.split()[-1] in name:
            return flops
    return float("nan")  # unknown accelerator: MFU is reported as nan rather than guessed
