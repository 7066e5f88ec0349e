"""What the report's memory picture shows, computed from the ledger alone (as onboard.report.facts
is for the others): each run's peak as its rung recorded it, the saved activations per memory
policy, and the tensor bytes per kernel the kernels rung decided by.

Two units, never mixed on one axis. A run's `peak_mem_bytes` is the allocator's peak on an
accelerator, but on CPU the process's peak resident set (RSS): it holds what malloc keeps and the
runtime's own, so a kernel that saves a fifth of a step's tensors barely moves it. The kernels rung
measures what its memory rule compares, each choice's fp32 forward + backward, as tensor bytes
(`details.peaks`, kernel_compare.step_peak: counted at the dispatcher on CPU by
titan_core.memory.tensor_peak, the allocator's peak allocated bytes elsewhere). A ledger from
before that record has no tensor figure: the picture says so, and draws no zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from onboard.report.facts import Record
from titan_core.memory.estimate import format_bytes

OTHER_RUNS = ("eager_", "baseline_")
"""Measurement prefixes that repeat another run's number beside a rung's own."""
KERNELS = "kernels"


@dataclass(frozen=True)
class MemoryBar:
    label: str
    rung: str
    peak_mem_bytes: int


@dataclass(frozen=True)
class PolicyBar:
    policy: str
    device_bytes: int
    host_bytes: int
    chosen: bool


def memory_bars(recs: list[Record]) -> list[MemoryBar]:
    """The recorded peak memory of each rung's timed run (and of the variants it timed beside it)."""
    out = []
    for rec in recs:
        for key, value in rec.m.items():
            # eager_peak_mem_bytes and the like repeat another rung's number beside this one's
            if key.endswith("peak_mem_bytes") and not key.startswith(OTHER_RUNS) and isinstance(value, int):
                variant = key.removesuffix("peak_mem_bytes").rstrip("_")
                rank0 = " (rank 0)" if rec.m.get("world_size", 1) != 1 else ""  # sharded runs report rank 0's rows
                out.append(MemoryBar(f"{rec.rung}{' ' + variant if variant else ''}{rank0}", rec.rung, value))
    return out


def policy_bars(recs: list[Record]) -> tuple[str | None, list[PolicyBar]]:
    """(rung, saved activation bytes per memory policy) from the last rung that measured them."""
    for rec in reversed(recs):
        m = rec.m
        saved = {
            k.removeprefix("saved_activation_bytes_"): v
            for k, v in m.items()
            if k.startswith("saved_activation_bytes_") and isinstance(v, int)
        }
        if saved:
            chosen = m.get("memory_policy_choice", m.get("memory_policy"))
            return rec.rung, [
                PolicyBar(p, b, int(m.get(f"saved_activation_host_bytes_{p}") or 0), p == chosen)
                for p, b in saved.items()
            ]
    return None, []


# ---- tensor bytes per kernel -------------------------------------------------------------------
@dataclass(frozen=True)
class TensorBar:
    """One kernel choice's tensor bytes at the peak of its fp32 forward + backward (kernels rung)."""

    field: str
    """The kernels field: loss, attention, moe, float8."""
    value: str
    """The choice: plain, fused_ce, sdpa, ..."""
    peak_bytes: int | None
    """Tensor bytes at the step's peak; None: not measured (a JAX-backed kernel allocates outside torch)."""
    held: bool
    """The recipe holds this choice after the rung."""
    saving: float | None = None
    """1 - this choice's peak / the holder's it was timed against, as the rung recorded it
    (`<field>_<value>_memory_saving`: the figure its memory rule decided by); None: none recorded."""

    @property
    def label(self) -> str:
        return f"{self.field}={self.value}"

    @property
    def saving_text(self) -> str:
        """The recorded saving in words ("7% less than its holder"), or "" without one."""
        if self.saving is None:
            return ""
        return f"{abs(self.saving):.0%} {'less' if self.saving >= 0 else 'more'} than its holder"


@dataclass(frozen=True)
class TensorPeaks:
    """The kernels rung's tensor bytes per choice, or why there are none."""

    bars: list[TensorBar] = field(default_factory=list)
    device: str | None = None
    """The device the rung measured on (cpu: counted at the dispatcher; else the allocator's peak)."""
    why_none: str = ""
    """Why nothing is drawn ("" when there are bars)."""

    @property
    def unit(self) -> str:
        """How the bytes were counted, for an axis label and the report's text."""
        if self.device == "cpu":
            return "counted at the dispatcher (TensorPeak)"
        return "the allocator's peak allocated bytes"


def _bytes(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def tensor_peaks(recs: list[Record]) -> TensorPeaks:
    """Each kernel choice's recorded tensor bytes (`details.peaks`, "field=value": bytes or None) from
    the kernels rung's latest entry, in the order it measured them; none, and why, without a record."""
    rec = next((r for r in recs if r.rung == KERNELS), None)
    if rec is None:
        return TensorPeaks(why_none="no tensor figure: the kernels rung has not run")
    peaks, device = rec.details.get("peaks"), rec.details.get("device")
    if not isinstance(peaks, dict) or not peaks:
        return TensorPeaks(device=device, why_none=(
            f"no tensor figure recorded: kernels attempt {rec.entry.get('attempt')} predates the per-kernel "
            "tensor peaks (details.peaks)"))  # fmt: skip
    bars = []
    for key, value in peaks.items():
        name, _, choice = str(key).partition("=")
        held = (rec.field_choices.get(name) or {}).get("value") == choice
        saving = rec.m.get(f"{name}_{choice}_memory_saving")
        number = isinstance(saving, (int, float)) and not isinstance(saving, bool) and math.isfinite(saving)
        bars.append(TensorBar(name, choice, _bytes(value), held, float(saving) if number else None))
    return TensorPeaks(bars, device)


def tensor_lines(t: TensorPeaks) -> list[str]:
    """Under the memory picture: the tensor bytes it draws, in words, or why there are none."""
    if not t.bars:
        return [f"Tensor memory per kernel: {t.why_none}.", ""]
    lines = [f"Tensor memory per kernel (the kernels rung's fp32 forward + backward, tensor bytes {t.unit}: "
             "the unit its memory rule decides by; a run's peak in the picture is the process's RSS on CPU):",
             ""]  # fmt: skip
    for b in t.bars:
        said = f", {b.saving_text}" if b.saving_text else ""
        held = " (the recipe holds it)" if b.held else ""
        lines.append(f"- kernels.{b.label}{held}: {format_bytes(b.peak_bytes, missing='not measured')}{said}")
    return lines + [""]
