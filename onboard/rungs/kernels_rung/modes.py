"""Whether a kernel runs in an execution mode: per-block compile without a graph break, and the
captured Graph Trainer step without a host sync.

A kernel can equal its plain path eagerly and still not run where the recipe trains: a
lazy import or a `.item()` inside it breaks a compiled block into pieces, a data-dependent
shape cannot be captured. `mode_check` builds the model with the kernel (as
`compare_kernel` does) and asks the mode's own tools, tracing only:
`titan_core.compile.explain_blocks` (dynamo, no backend compile) for per-block compile,
`find_host_syncs` (make_fx on fake tensors) for the Graph Trainer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from titan_core.compile import explain_blocks, graph_breaks_total
from titan_core.compile.graph_trainer import CaptureError, find_host_syncs
from titan_core.config.execution_modes import MODES
from titan_core.config.sections import Kernels, Optimizer
from onboard.rungs.kernels_rung.compare import build_model_with, kernels_for, make_batch, parse_flag
from titan_core.models.common.args import TransformerArgs
from titan_core.training.optim import build_optimizer


def _one_line(reason: str) -> str:
    """Dynamo's first line of a break reason, and the user frame it points at (the last ' at ')."""
    head = reason.splitlines()[0] if reason else reason
    where = reason.rsplit(" at ", 1)[-1] if " at " in reason else ""
    return f"{head} (at {where})" if where and where not in head else head


def mode_check(
    family: str,
    args: TransformerArgs,
    flag: str,
    *,
    mode: str,
    batch: int = 2,
    seq_len: int = 64,
    device: torch.device | str = "cpu",
    packed: bool = False,
    base: Kernels | None = None,
    build_meta_model: Callable[[], nn.Module] | None = None,
    max_norm: float = 1.0,
) -> dict:
    """{"mode", "ok", "graph_breaks", "host_syncs", "reason"} of the model with `flag` in `mode`.

    `reason` is None when it runs there; otherwise one line naming the first break or sync.
    Eager needs no check. fp32, like the comparison.
    """
    if mode not in MODES:
        raise ValueError(f"unknown execution mode '{mode}' (one of {', '.join(MODES)})")
    out = {"mode": mode, "ok": True, "graph_breaks": None, "host_syncs": None, "reason": None}
    if mode == "eager":
        return out
    field_name, choice = parse_flag(flag)
    model = build_model_with(family, args, kernels_for(field_name, choice, base), device, torch.float32,
                             build_meta_model=build_meta_model, field_name=field_name)  # fmt: skip
    b = make_batch(args, batch=batch, seq_len=seq_len, seed=0, device=device, packed=packed)
    if mode == "compile":
        report = explain_blocks(model, b)
        n = graph_breaks_total(report)
        first = next((f"{r.path}: {_one_line(r.reasons[0])}" for r in report.values() if r.breaks and r.reasons), None)
        out.update(graph_breaks=n, ok=n == 0)
        if n:
            out["reason"] = f"{flag} graph-breaks {n} time(s) under per-block compile (first: {first})"
        return out
    optimizer = build_optimizer(model, Optimizer())
    try:
        syncs = find_host_syncs(model, optimizer, [b], max_norm=max_norm)
    except CaptureError as e:
        out.update(ok=False, reason=f"{flag} cannot be captured by the Graph Trainer: {e}")
        return out
    out.update(host_syncs=len(syncs), ok=not syncs)
    if syncs:
        s = syncs[0]
        out["reason"] = (
            f"{flag} syncs the host {len(syncs)} time(s) in the captured step (first: {s.op}: {s.why} at {s.where or '?'})"
        )
    return out
