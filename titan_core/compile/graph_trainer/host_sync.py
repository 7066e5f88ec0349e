"""Host syncs: ops that make the host wait for the device, found while tracing or in a graph.

A captured step must run from the first forward op to the weight write-back without the
host reading a device value: every such read stalls the device queue and, inside a
graph, either bakes one batch's value into the program or leaves a data-dependent shape.
Tracing with `HostSyncGuard` active fails at the offending line (the usual culprits:
`.item()`, `.tolist()`, `bool(t)`, `torch.where(cond)`, boolean-mask indexing, as in a
per-expert MoE loop); `host_sync_nodes(gm)` lists the same ops in a finished graph.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: op -> why it syncs
SYNC_OPS: dict = {
    aten._local_scalar_dense.default: "reads a device value on the host (.item(), .tolist(), bool(t), int(t), float(t))",
    aten.is_nonzero.default: "reads a device value on the host (bool(t), `if t:`)",
    aten.equal.default: "returns a Python bool computed on the device (torch.equal)",
    aten.nonzero.default: "output shape depends on the data (nonzero, torch.where(cond), argwhere)",
    aten.masked_select.default: "output shape depends on the data (masked_select)",
    aten.repeat_interleave.Tensor: "output shape depends on the data (repeat_interleave without output_size)",
    aten._unique2.default: "output shape depends on the data (unique)",
    aten.unique_dim.default: "output shape depends on the data (unique)",
    aten.unique_consecutive.default: "output shape depends on the data (unique_consecutive)",
    aten.bincount.default: "output shape depends on the data (bincount)",
}


class HostSyncError(RuntimeError):
    """The traced step would make the host wait for the device; `found` lists the syncs met."""

    def __init__(self, message: str, found: list | None = None):
        super().__init__(message)
        self.found = list(found or [])


@dataclass(frozen=True)
class HostSync:
    op: str
    """The aten op, e.g. `aten.nonzero.default`."""
    why: str
    """Why it synchronises."""
    where: str
    """The innermost user-code frame that issued it (empty when found in a graph)."""


def _is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype == torch.bool


def _sync_reason(func, args, kwargs) -> str | None:
    """Why calling `func` on these (possibly fake) arguments syncs the host, or None."""
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is not None:
        return None  # the caller gave the size: nothing to read back
    if func in SYNC_OPS:
        return SYNC_OPS[func]
    if func is aten.index.Tensor and len(args) > 1 and any(_is_mask(i) for i in args[1]):
        return "boolean-mask indexing: output shape depends on the data (x[mask])"
    if func is aten._to_copy.default and args and isinstance(args[0], torch.Tensor):
        # a copy from an accelerator to the host waits for the device; cpu -> cpu does not
        dev = kwargs.get("device")
        if args[0].device.type != "cpu" and dev is not None and torch.device(dev).type == "cpu":
            return "copies a device tensor to the host (.cpu(), .to('cpu'))"
    return None


def describe(sync: HostSync) -> str:
    return (
        f"host sync inside the captured step: {sync.op} {sync.why}\n  at {sync.where or '(no user frame)'}\n"
        "Make the code shape-static (for MoE routing use the static-shape experts: "
        "--kernels.moe=dense) or keep the value on the device."
    )


def _user_frame() -> str:
    """The innermost frame outside torch: where the model code asked for the sync."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or "/titan_core/compile/" in path:
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}: {frame.line}"
    return ""


class HostSyncGuard(TorchDispatchMode):
    """While tracing: raise HostSyncError at the first sync op, or record every one.

    Enter it inside the traced function so it sees each op before the tracer does.
    """

    # scan and other higher-order ops pass through; their bodies are traced into subgraphs
    # that host_sync_nodes() inspects after the capture
    supports_higher_order_operators = True

    def __init__(self, *, record: bool = False):
        super().__init__()
        self.record = record
        self.found: list[HostSync] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        reason = _sync_reason(func, args, kwargs)
        if reason is not None:
            sync = HostSync(str(func), reason, _user_frame())
            self.found.append(sync)
            if not self.record:
                raise HostSyncError(describe(sync), [sync])
        return func(*args, **kwargs)


def host_sync_nodes(gm: GraphModule) -> list[Node]:
    """Nodes of a captured graph (and of its subgraphs, e.g. a scan body) that would make the host wait."""
    found = []
    for sub in gm.children():
        if isinstance(sub, GraphModule):
            found += host_sync_nodes(sub)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue

        def val(a):
            return a.meta.get("val") if isinstance(a, Node) else a

        args = tuple(val(a) for a in node.args)
        if node.target is aten.index.Tensor and len(args) > 1:
            args = (args[0], [val(i) for i in node.args[1]])
        reason = _sync_reason(node.target, args, node.kwargs)
        if reason is not None and not node.meta.get("gt_offloaded"):
            found.append(node)
    return found


def subgraph_syncs(gm: GraphModule) -> list[HostSync]:
    """Sync ops inside the subgraphs of `gm` (bodies of higher-order ops the guard does not see)."""
    out = []
    for name, sub in gm.named_children():
        if isinstance(sub, GraphModule):
            for node in host_sync_nodes(sub):
                out.append(
                    HostSync(
                        str(node.target), "sync op inside a higher-order op body", f"subgraph {name}, node {node.name}"
                    )
                )
    return out
