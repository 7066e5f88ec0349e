"""Per-block torch.compile: each decoder block and the loss head compiled on their own.

Blocks are compiled in place (`Module.compile`), so module paths, state-dict keys and
checkpoints are unchanged. Compiling per block rather than the whole model keeps a
graph break local (the rest of the model stays compiled) and lets identical blocks share
one compiled graph (dynamo treats their weights as inputs).

Graph breaks are counted per block with `torch._dynamo.explain` on the inputs each block
really receives, with the reason of each break, so a caller can require 0 inside a
block. Usual causes: data-dependent Python (`if t.sum() > 0`), `.item()` / `.tolist()`
(e.g. MoE routing with `torch.where` per expert: use `kernels.moe=dense`), unbacked
(data-dependent) shapes, and calls dynamo cannot trace (C extensions, some prints).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch._dynamo.utils
from torch import nn

# importing registers the capture-friendly MoE experts swap (`moe.dense`)
import titan_core.models.common.moe_static  # noqa: F401

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel


@dataclass
class BlockBreaks:
    """What dynamo made of one compiled module."""

    path: str
    """Module path, e.g. `layers.0` or `loss_head`."""
    graphs: int
    """Graphs dynamo produced (1 when there is no break)."""
    breaks: int
    """Graph breaks inside the module."""
    reasons: list[str] = field(default_factory=list)
    """One line per break: dynamo's reason and the user frame it points at."""


def compiled_modules(model: TrainableModel) -> dict[str, nn.Module]:
    """The modules per-block compile compiles: every decoder block and the loss head (if any)."""
    mods = {f"layers.{name}": block for name, block in model.layers.items()}
    if model.loss_head is not None:
        mods["loss_head"] = model.loss_head
    return mods


def apply_per_block_compile(model: TrainableModel, *, backend: str = "inductor", fullgraph: bool = False) -> list[str]:
    """Compile every block and the loss head in place; returns their module paths."""
    mods = compiled_modules(model)
    for mod in mods.values():
        mod.compile(backend=backend, fullgraph=fullgraph)
    return list(mods)


def _record_inputs(model: TrainableModel, batch) -> dict[str, tuple[tuple, dict]]:
    """Run one eager forward and keep the (args, kwargs) each compiled module receives."""
    seen: dict[str, tuple[tuple, dict]] = {}
    handles = []
    for path, mod in compiled_modules(model).items():

        def hook(m, args, kwargs, path=path):
            if path not in seen:
                seen[path] = (tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), dict(kwargs))

        handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))

    # force_eager: `Module.compile` compiles the module's whole call, hooks included, so this forward
    # would trace the recording hook once per block (its `path` a new constant each time) and warn
    # "hit config.recompile_limit" about a hook of ours, which reads like a problem of the model
    @torch._dynamo.disable
    def run():
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            model.loss(batch.tokens, batch.labels, **batch.loss_kwargs())

    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return seen


def explain_blocks(model: TrainableModel, batch) -> dict[str, BlockBreaks]:
    """Graph breaks per compiled module on this batch, with reasons (resets dynamo's caches)."""
    inputs = _record_inputs(model, batch)
    out = {}
    for path, mod in compiled_modules(model).items():
        if path not in inputs:
            continue  # not reached by the forward (cannot happen for decoder blocks)
        args, kwargs = inputs[path]
        forward = type(mod).forward.__get__(mod)  # the plain method, around any in-place compile
        e = torch._dynamo.explain(forward)(*args, **kwargs)
        reasons = []
        for r in e.break_reasons:
            frame = r.user_stack[-1] if r.user_stack else None
            where = f" at {frame.filename}:{frame.lineno}" if frame is not None else ""
            reasons.append(f"{r.reason}{where}")
        out[path] = BlockBreaks(path, e.graph_count, e.graph_break_count, reasons)
    return out


def graph_breaks_total(report: dict[str, BlockBreaks]) -> int:
    """Sum of breaks over all compiled modules (0 when every block compiled whole)."""
    return sum(b.breaks for b in report.values())


def dynamo_compile_seconds() -> float:
    """Seconds spent in dynamo compiles (tracing + backend) in this process so far."""
    return float(sum(torch._dynamo.utils.compilation_time_metrics.get("_compile.compile_inner", [])))
