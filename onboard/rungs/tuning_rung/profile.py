"""Where a step's time goes: a few steady steps under torch.profiler, the time by category, the
top ops, the trace file, and the lever the optimisation handbook points to for the biggest part.

Each profiled step runs inside a `record_function(STEP_MARK)`. The profiler's event tree then
partitions the mark's duration exactly: every op's *self* time (its time minus its children's)
goes to one category, and the mark's own self time, the stretches where no op ran, is
`host_gaps` (Python, the data loader, waiting on a sync). A category is decided by the
outermost enclosing op that names one: the bmm inside an attention op is attention time,
an op under `Optimizer.step` is optimizer time.

    matmul              mm / addmm / bmm / linear / grouped mm, forward and backward
    attention           scaled-dot-product / flash / flex attention, forward and backward
    norms_elementwise   everything else that computes: norms, activations, adds, casts, fused kernels
    communication       collectives and their waits (c10d, NCCL, gloo, functional collectives)
    optimizer           under Optimizer.step, and the foreach updates of a captured step or clipping
    host_gaps           no op running inside the step

On CPU the times are the host's; on CUDA the ops' device (kernel) self times, and the gaps
are the step's wall time the device was not busy. `sum_rel_err` states how far categories
plus gaps are from the same steps' wall time measured outside the profiler. Both are means over
the profiled steps: on a shared machine one step can take three times another, and a median wall
time set against a mean of categories would measure that noise, not the profile's coverage.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from titan_core.runtime import devices

STEP_MARK = "titan_core.tuning.step"
CATEGORIES = ("matmul", "attention", "norms_elementwise", "communication", "optimizer", "host_gaps")

# The lever the handbook points to when a category dominates the step.
LEVERS = {
    "matmul": "the matmuls are the step: raise the batch until memory binds (more work per launch), train in "
    "bf16 (training.dtype / mixed precision), and check MFU against the device's peak",
    "attention": "attention dominates: an attention kernel and its block sizes (kernels.attention), or a "
    "shorter sequence / sliding window if the model allows",
    "norms_elementwise": "memory-bound elementwise work dominates: fuse it (per-block compile, compile.enable, or "
    "the Graph Trainer with inductor, graph_trainer.compile = inductor)",
    "communication": "collectives dominate: overlap them with compute (prefetching all-gathers, the latency-hiding "
    "scheduler on TPU), keep all-gathers within a host (HSDP), or shard less",
    "optimizer": "the optimizer step dominates: a fused/foreach AdamW, or capture the update with the step "
    "(the Graph Trainer)",
    "host_gaps": "the host is the bottleneck (the device waits between ops): capture the step (Graph Trainer), "
    "replay it as a CUDA graph (cudagraphs), remove host syncs, raise the batch",
}

_ATTENTION = ("scaled_dot_product", "scaleddotproduct", "flash_attention", "flashattention", "efficient_attention",
              "flex_attention", "flexattention", "attention")  # fmt: skip
_MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_grouped_mm",
           "mmbackward", "addmmbackward", "bmmbackward", "baddbmmbackward", "linearbackward", "groupedmm")  # fmt: skip
_COMM = ("c10d", "nccl", "gloo", "all_gather", "allgather", "reduce_scatter", "reducescatter", "all_reduce",
         "allreduce", "wait_tensor", "broadcast", "_c10d_functional")  # fmt: skip
_OPTIM = ("optimizer.step", "optimizer.zero_grad", "_foreach_", "adamw", "fused_adam")


def category_of(name: str) -> str | None:
    """The category an event's name claims, or None (it takes its enclosing op's, else norms_elementwise)."""
    n = name.lower()
    if any(k in n for k in _OPTIM):
        return "optimizer"
    if any(k in n for k in _COMM):
        return "communication"
    if any(k in n for k in _ATTENTION):
        return "attention"
    if any(n == k or n.startswith(k + "_") or (not k.startswith("aten::") and k in n) for k in _MATMUL):
        return "matmul"
    return None


@dataclass
class Breakdown:
    steps: int
    step_time_s: float
    """Median wall time of one profiled step, measured outside the profiler's event tree (the figure
    reported: robust to one step the machine stole time from)."""
    seconds: dict[str, float]
    """Per step: seconds in each category (CATEGORIES), means over the profiled steps; they sum to
    `wall_mean_s` up to the profiler's own overhead."""
    fractions: dict[str, float]
    biggest: str
    lever: str
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    trace_path: str | None = None
    wall_mean_s: float = 0.0
    """Mean wall time of the profiled steps, measured outside the profiler: what `seconds` partitions."""
    sum_rel_err: float = 0.0
    """|sum of categories - wall_mean_s| / wall_mean_s: time the profile does not account for (the
    profiler's own overhead, or ops it did not see)."""
    timeline: str = "host"
    """host (CPU: the ops' host times) or device (CUDA: kernel times; gaps are device idle)."""

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        parts = ", ".join(f"{c} {self.fractions[c]:.0%}" for c in CATEGORIES if self.fractions[c] >= 0.005)
        return f"{self.step_time_s * 1e3:.0f} ms/step: {parts}; biggest {self.biggest}: {self.lever}"


def _walk(events) -> tuple[dict[str, float], dict[str, list], list[float]]:
    """(seconds per category over all steps, {(op, category): [self seconds, category, calls]}, each step
    mark's length)."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    ops: dict[tuple[str, str], list] = {}
    marks: list[float] = []
    device = any(getattr(e, "self_device_time_total", 0) for e in events)

    def visit(e, inherited: str | None) -> None:
        cat = inherited or category_of(e.name)
        own = (e.self_device_time_total if device else e.self_cpu_time_total) / 1e6
        label = cat or "norms_elementwise"
        seconds[label] += own
        entry = ops.setdefault((e.name, label), [0.0, label, 0])
        entry[0] += own
        entry[2] += 1
        for child in e.cpu_children:
            visit(child, cat)

    for mark in (e for e in events if e.name == STEP_MARK):
        length = (mark.time_range.end - mark.time_range.start) / 1e6
        marks.append(length)
        if device:
            busy = 0.0
            for child in mark.cpu_children:
                before = sum(seconds.values())
                visit(child, None)
                busy += sum(seconds.values()) - before
            seconds["host_gaps"] += max(0.0, length - busy)
        else:
            seconds["host_gaps"] += mark.self_cpu_time_total / 1e6
            for child in mark.cpu_children:
                visit(child, None)
    return seconds, ops, marks


def breakdown_of(events, wall_times: list[float], *, top: int = 10, trace_path: str | None = None) -> Breakdown:
    """The Breakdown of profiler `events` holding len(wall_times) STEP_MARK ranges."""

    seconds, ops, marks = _walk(events)
    n = max(1, len(marks))
    per_step = {c: s / n for c, s in seconds.items()}
    total = sum(per_step.values())
    step = statistics.median(wall_times) if wall_times else total
    mean = statistics.fmean(wall_times) if wall_times else total
    fractions = {c: (s / total if total > 0 else 0.0) for c, s in per_step.items()}
    biggest = max(CATEGORIES, key=lambda c: per_step[c])
    top_ops = sorted(ops.items(), key=lambda kv: -kv[1][0])[:top]
    device = any(getattr(e, "self_device_time_total", 0) for e in events)
    return Breakdown(
        steps=len(marks),
        step_time_s=step,
        seconds=per_step,
        fractions=fractions,
        biggest=biggest,
        lever=LEVERS[biggest],
        top_ops=[
            {"op": name, "category": cat, "self_s_per_step": s / n, "calls_per_step": calls / n}
            for (name, _), (s, cat, calls) in top_ops
        ],
        trace_path=trace_path,
        wall_mean_s=mean,
        sum_rel_err=abs(total - mean) / mean if mean > 0 else 0.0,
        timeline="device" if device else "host",
    )


def profile_steps(
    step: Callable[[], Any],
    *,
    steps: int,
    device: torch.device | str = "cpu",
    trace_path: Path | None = None,
    top: int = 10,
) -> Breakdown:
    """Run `step()` `steps` times under torch.profiler (the caller warms it up first) and break the
    time down; the Chrome trace goes to `trace_path` when given."""
    device = torch.device(device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    walls: list[float] = []
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            devices.synchronize(device)
            t0 = time.perf_counter()
            with torch.profiler.record_function(STEP_MARK):
                step()
                devices.synchronize(device)
            walls.append(time.perf_counter() - t0)
    path = None
    if trace_path is not None:
        trace_path = Path(trace_path)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
        path = str(trace_path)
    return breakdown_of(prof.events(), walls, top=top, trace_path=path)
