"""How many bytes one training process may use on its device, and where that number comes from.

    budget = device_budget(torch.device("cpu"))   # Budget(bytes=..., source="MemAvailable in /proc/meminfo")

CPU: the kernel's MemAvailable, lowered to what a cgroup memory limit or an address-space
limit (`ulimit -v`) leaves, and split between the processes of this host (LOCAL_WORLD_SIZE:
ranks on one host share its RAM). CUDA: the device's free memory. TPU: the HBM of one chip
from a table (the kind comes from TPU_ACCELERATOR_TYPE, which Cloud TPU VMs set); the
runtime's own reservation is not subtracted. None when nothing says.
"""

from __future__ import annotations

import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path

import torch

GIB = 2**30

# HBM per chip, from Google Cloud's TPU system-architecture pages (v4, v5e, v5p, v6e) and the
# Ironwood announcement (v7x).
TPU_HBM_GIB: dict[str, int] = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "v7x": 192}
# Memory per GPU for plans (a GPU at hand reports its own free memory instead), from the vendors'
# datasheets; their "GB" figures are what the runtime reports as GiB, within a few percent.
GPU_HBM_GIB: dict[str, int] = {
    "a100": 80,  # NVIDIA A100 80GB datasheet
    "h100": 80,  # NVIDIA H100 SXM datasheet: 80GB HBM3
    "h200": 141,  # NVIDIA H200 datasheet: 141GB HBM3e
    "b200": 180,  # NVIDIA HGX B200 datasheet: 1,440GB over 8 GPUs
    "mi300x": 192,  # AMD Instinct MI300X datasheet: 192GB HBM3
}
# Names the chip goes by in accelerator types and device strings: v5litepod-8 is a v5e, tpu7x a v7x.
_TPU_ALIASES = (("v5litepod", "v5e"), ("v5lite", "v5e"), ("tpu7x", "v7x"), ("7x", "v7x"), ("ironwood", "v7x"),
                ("trillium", "v6e"), ("v6e", "v6e"), ("v5e", "v5e"), ("v5p", "v5p"), ("v4", "v4"))  # fmt: skip


@dataclass(frozen=True)
class Budget:
    bytes: int
    """What one process may allocate."""
    source: str
    """Where the number comes from, for a message."""


def tpu_kind(name: str) -> str | None:
    """The TPU_HBM_GIB key of an accelerator type or device name (`v5litepod-16` -> v5e), or None."""
    low = name.lower()
    for alias, kind in _TPU_ALIASES:
        if alias in low:
            return kind
    return None


def tpu_hbm_bytes(name: str) -> int | None:
    """HBM of one chip of the TPU `name` names (see `tpu_kind`), or None for an unknown chip."""
    kind = tpu_kind(name)
    return TPU_HBM_GIB[kind] * GIB if kind else None


def device_budget(
    device: torch.device | str, *, override_gib: float = 0.0, local_processes: int | None = None
) -> Budget | None:
    """The memory one training process may use on `device` (see the module docstring).

    `device`: a torch.device or a device type ("tpu" is only a torch.device once torch_tpu is loaded).
    `override_gib` > 0 (device.memory_budget_gib) replaces what the device says.
    `local_processes`: ranks sharing this host's RAM (CPU only; default LOCAL_WORLD_SIZE or 1).
    """
    kind = device if isinstance(device, str) else device.type
    if override_gib > 0:
        return Budget(int(override_gib * GIB), f"device.memory_budget_gib = {override_gib:g}")
    if kind == "cuda":
        device = torch.device(device)
        free, _ = torch.cuda.mem_get_info(device)
        return Budget(int(free), f"free memory of {torch.cuda.get_device_name(device)} (torch.cuda.mem_get_info)")
    if kind == "tpu":
        name = os.environ.get("TPU_ACCELERATOR_TYPE", "")
        hbm = tpu_hbm_bytes(name)
        return Budget(hbm, f"HBM of one TPU {tpu_kind(name)} chip (table)") if hbm else None
    if kind != "cpu":
        return None
    budget = cpu_budget()
    n = local_processes if local_processes is not None else _int_env("LOCAL_WORLD_SIZE", 1)
    if budget is None or n <= 1:
        return budget
    return Budget(budget.bytes // n, f"{budget.source}, shared by {n} processes on this host")


def cpu_budget() -> Budget | None:
    """The tightest of MemAvailable, a cgroup memory limit and the address-space limit."""
    found = []
    meminfo = _meminfo()
    if "MemAvailable" in meminfo:
        found.append(Budget(meminfo["MemAvailable"], "MemAvailable in /proc/meminfo"))
    cgroup = cgroup_room()
    if cgroup is not None:
        found.append(cgroup)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _status_kib("VmSize") * 1024
        found.append(Budget(max(0, soft - used), "the address-space limit (ulimit -v) less what this process maps"))
    return min(found, key=lambda b: b.bytes) if found else None


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                out[key] = int(fields[0]) * 1024  # kB
    except OSError:
        pass  # not Linux: no figure from here
    return out


def _status_kib(key: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> Budget | None:
    """Limit minus usage of this process's memory cgroup (v2, else v1), page cache that can be
    reclaimed counted as free; None without a limit."""
    for limit_file, usage_file, cache_key in (
        ("memory.max", "memory.current", "inactive_file"),  # cgroup v2
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "total_inactive_file"),  # cgroup v1
    ):
        limit, usage = _read_int(root / limit_file), _read_int(root / usage_file)
        if limit is None or usage is None or limit >= 2**60:  # "max", or v1's "no limit" (a huge number)
            continue
        stat = root / Path(limit_file).parent / "memory.stat"
        cache = _stat_value(stat, cache_key)
        return Budget(max(0, limit - usage + cache), f"the cgroup memory limit ({root / limit_file}) less its usage")
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat_value(path: Path, key: str) -> int:
    try:
        match = re.search(rf"^{key} (\d+)$", path.read_text(), re.MULTILINE)
    except OSError:
        return 0
    return int(match.group(1)) if match else 0


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else default
