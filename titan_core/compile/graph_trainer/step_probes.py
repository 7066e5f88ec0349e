"""Measurements of the Graph Trainer's captured step, without training.

Each function captures the step of a built model and optimizer on one batch (tracing
only: nothing runs on the device, the weights are untouched): saved-activation bytes per
memory policy, the ops that would sync the host, programs launched per step.
"""

from __future__ import annotations

from torch import nn

from titan_core.compile.graph_trainer.host_sync import HostSync, HostSyncError, host_sync_nodes
from titan_core.compile.graph_trainer.memory_policy import POLICIES, ActivationBytes, saved_activation_bytes
from titan_core.compile.graph_trainer.runner import GraphTrainStep
from titan_core.config.sections import GraphTrainer

#: the passes that implement a memory policy; dropping them all measures the untouched capture
POLICY_PASSES = ("tag_memory_policy", "apply_offload", "apply_recompute")


def _capture(model, optimizer, batches, *, max_norm: float, on_host_sync: str = "raise", **section) -> GraphTrainStep:
    step = GraphTrainStep(
        model,
        optimizer,
        max_norm=max_norm,
        grad_accum=len(batches),
        config=GraphTrainer(**section),
        on_host_sync=on_host_sync,
    )
    step.capture(batches)
    return step


def measure_memory_policies(
    model: nn.Module, optimizer, batches: list, *, max_norm: float = 1.0, scan_layers: bool = False
) -> dict[str, ActivationBytes]:
    """Saved-activation bytes of the captured step under each memory policy, and `none` (no policy pass)."""
    out = {
        "none": saved_activation_bytes(
            _capture(
                model, optimizer, batches, max_norm=max_norm, scan_layers=scan_layers, disable_passes=POLICY_PASSES
            ).captured.gm
        )
    }
    for policy in POLICIES:
        step = _capture(model, optimizer, batches, max_norm=max_norm, scan_layers=scan_layers, memory_policy=policy)
        out[policy] = saved_activation_bytes(step.captured.gm)
    return out


def find_host_syncs(model: nn.Module, optimizer, batches: list, *, max_norm: float = 1.0) -> list[HostSync]:
    """Every op in the step that would make the host wait for the device (empty: none)."""
    try:
        step = _capture(model, optimizer, batches, max_norm=max_norm, on_host_sync="record")
    except HostSyncError as e:  # the trace could not go on past a synced value
        return e.found
    found = list(step.stats.host_syncs)
    traced = {s.op for s in found}
    # ops the guard could not see while tracing (none today) still show in the graph
    for node in host_sync_nodes(step.captured.gm):
        if str(node.target) not in traced:
            found.append(HostSync(str(node.target), "sync op in the captured graph", node.name))
    return found


def graphs_per_step(step: GraphTrainStep) -> list[int]:
    """Programs launched by each step run so far (1 per step unsplit, 2 split)."""
    return list(step.stats.programs_per_step)
