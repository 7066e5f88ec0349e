"""The one table of target devices a plan knows: per device kind its host, memory, peak FLOP/s and
links, each row with its published source.

    hw = HARDWARE["v7x"]
    hw.peak_bf16, hw.peak_fp8, hw.scale_up_bw, hw.scale_up_domain, hw.scale_out_bw, hw.source

Memory and the bf16 peak are the ones titan_core already holds (`TPU_HBM_GIB` / `GPU_HBM_GIB`
in titan_core/memory/budget.py, `PEAK_BF16_FLOPS` in titan_core/runtime/devices.py: the trainer's
MFU uses that peak, so a plan's MFU means the same); a row reads them from there rather than
keeping a second copy, and adds what only a plan needs: the float8 peak and the links.

HBM bandwidth sets the roofline of a matmul with few rows (plan/step_time.py: routed experts).
Links, in bytes per second one device moves in ONE direction (a ring collective's bottleneck):
- scale-up: TPU ICI (the published figure is bidirectional per chip, over all its ports: halved
  here), NVLink / Infinity Fabric (bidirectional per GPU: halved);
- `scale_up_domain`: devices that fabric joins without the data-centre network: a TPU pod
  (a slice up to it is one ICI torus), an 8-GPU HGX / MI300X board;
- scale-out: between domains, per device: TPU DCN per chip; one 400 Gb/s NIC per GPU (DGX /
  HGX reference designs, and TorchTitan's H100 cluster: "400 Gb/s per GPU").
- `torus_dims`: 3 (v5p, v7x) or 2 (v5e, v6e) for a TPU's ICI torus, 0 for a switched fabric
  (NVSwitch, Infinity Fabric): an all-to-all on a torus crosses several links per message.
"""

from __future__ import annotations

from dataclasses import dataclass

from titan_core.memory.budget import GIB, GPU_HBM_GIB, TPU_HBM_GIB
from titan_core.runtime.devices import PEAK_BF16_FLOPS

GB = 1e9
GBIT = 1e9 / 8


@dataclass(frozen=True)
class Hardware:
    kind: str
    device_type: str
    """tpu | cuda: the trainer's [device] type."""
    per_host: int
    """Devices one host (VM) drives: the processes torchrun starts per node."""
    memory_bytes: int
    peak_bf16: float
    peak_fp8: float
    """Dense float8 peak (equal to bf16 where the chip has no faster float8 path)."""
    hbm_bw: float
    """HBM bytes/s: below peak_bf16 / hbm_bw FLOPs per weight byte a matmul waits on memory (an expert's
    few rows are, unless EP gathers more tokens per expert)."""
    scale_up_bw: float
    """Bytes/s one device moves in one direction over its fast fabric (ICI, NVLink, Infinity Fabric)."""
    scale_up_domain: int
    """Devices that fabric joins (TPU pod, 8-GPU board); beyond it traffic crosses scale-out."""
    scale_out_bw: float
    """Bytes/s per device, one direction, between domains (TPU DCN, a GPU's NIC)."""
    torus_dims: int
    """Dimensions of the ICI torus (3 or 2); 0: a switched fabric, every pair one hop apart."""
    source: str


def _tpu(kind: str, per_host: int, fp8_tflops: float, hbm_gbs: float, ici_bidir_gbs: float, pod: int,
         dcn_gbit: float, dims: int, source: str) -> Hardware:  # fmt: skip
    return Hardware(kind, "tpu", per_host, TPU_HBM_GIB[kind] * GIB, PEAK_BF16_FLOPS[f"tpu {kind}"], fp8_tflops * 1e12,
                    hbm_gbs * GB, ici_bidir_gbs * GB / 2, pod, dcn_gbit * GBIT, dims, source)  # fmt: skip


def _gpu(kind: str, fp8_tflops: float, hbm_gbs: float, fabric_bidir_gbs: float, nic_gbit: float,
         source: str) -> Hardware:  # fmt: skip
    return Hardware(kind, "cuda", 8, GPU_HBM_GIB[kind] * GIB, PEAK_BF16_FLOPS[kind], fp8_tflops * 1e12, hbm_gbs * GB,
                    fabric_bidir_gbs * GB / 2, 8, nic_gbit * GBIT, 0, source)  # fmt: skip


HARDWARE: dict[str, Hardware] = {
    h.kind: h
    for h in (
        _tpu("v5e", 4, 197, 859, 400, 256, 25, 2,
             "Google Cloud TPU v5e docs: 197 TFLOP/s bf16 (int8 only beyond it), 16 GB HBM at 800 GiB/s, "
             "400 GB/s bidirectional ICI per chip, 2D torus, 256-chip pod, 2 x 100 Gb/s NICs per 8-chip host; "
             "4-chip VMs (ct5lp-hightpu-4t)"),
        _tpu("v5p", 4, 459, 2765, 1200, 8960, 50, 3,
             "Google Cloud TPU v5p / TPU7x docs: 459 TFLOP/s bf16 and fp8, 95 GiB HBM at 2,765 GB/s, "
             "1,200 GB/s bidirectional ICI per chip, 3D torus, 8,960-chip pod, DCN 50 Gb/s per chip; 4-chip VMs"),
        _tpu("v6e", 4, 918, 1638, 800, 256, 100, 2,
             "Google Cloud TPU v6e / TPU7x docs: 918 TFLOP/s bf16 and fp8, 32 GB HBM at 1,638 GB/s, "
             "800 GB/s bidirectional ICI per chip, 2D torus, 256-chip pod, DCN 100 Gb/s per chip; "
             "4-chip VMs (ct6e-standard-4t)"),
        _tpu("v7x", 4, 4614, 7380, 1200, 9216, 100, 3,
             "Google Cloud TPU7x (Ironwood) docs: 2,307 TFLOP/s bf16, 4,614 fp8, 192 GiB HBM at 7,380 GB/s, "
             "1,200 GB/s bidirectional ICI per chip, 3D torus, 9,216-chip pod, DCN 100 Gb/s per chip; 4-chip VMs"),
        _gpu("h100", 1979, 3350, 900, 400,
             "NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 / 1,979 fp8 dense, 80 GB at 3.35 TB/s, "
             "NVLink 900 GB/s bidirectional; DGX H100: 8 GPUs, one 400 Gb/s ConnectX-7 NIC per GPU"),
        _gpu("h200", 1979, 4800, 900, 400,
             "NVIDIA H200 SXM datasheet: 989 TFLOP/s bf16 / 1,979 fp8 dense, 141 GB at 4.8 TB/s, "
             "NVLink 900 GB/s bidirectional; DGX H200: 8 GPUs, one 400 Gb/s NIC per GPU"),
        _gpu("b200", 4500, 8000, 1800, 400,
             "NVIDIA HGX B200 datasheet: 2.25 PFLOP/s bf16 / 4.5 fp8 dense per GPU, 180 GB at 8 TB/s, "
             "NVLink 5 1.8 TB/s bidirectional; DGX B200: 8 GPUs, one 400 Gb/s ConnectX-7 NIC per GPU"),
        _gpu("mi300x", 2614.9, 5300, 896, 400,
             "AMD Instinct MI300X datasheet: 1,307.4 TFLOP/s bf16 / 2,614.9 fp8 dense, 192 GB at 5.3 TB/s, "
             "7 Infinity Fabric links x 128 GB/s bidirectional; 8-GPU platform, one 400 Gb/s NIC per GPU"),
    )
}  # fmt: skip
PER_HOST = {kind: h.per_host for kind, h in HARDWARE.items()}
"""Devices per host of each kind: the fast group TP stays within, and torchrun's processes per node."""
KINDS = (*HARDWARE, "cpu")


def table_rows() -> list[dict]:
    """The table as JSON-ready rows (what `bench/plan_vs_published.py` prints beside its figures)."""
    return [
        {"kind": h.kind, "per_host": h.per_host, "memory_bytes": h.memory_bytes, "peak_bf16_flops": h.peak_bf16,
         "peak_fp8_flops": h.peak_fp8, "hbm_bytes_per_s": h.hbm_bw, "scale_up_bytes_per_s": h.scale_up_bw,
         "scale_up_domain": h.scale_up_domain,
         "scale_out_bytes_per_s": h.scale_out_bw, "torus_dims": h.torus_dims, "source": h.source}
        for h in HARDWARE.values()
    ]  # fmt: skip
