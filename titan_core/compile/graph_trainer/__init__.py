"""The Graph Trainer: the whole train step captured with make_fx and run as one program.

capture.py traces forward + loss + autograd.grad + clipping + functional AdamW into one
FX graph (params.py: how sharded parameters enter it); passes.py holds the pass contract
and pipeline, registry.py the pass registry; memory_policy.py the save / recompute /
offload tagging and the passes that act on it; scan.py runs identical blocks as one loop;
split.py cuts forward and backward into two programs; runner.py runs it all as the
trainer's step; step_probes.py measures the captured step without training.
"""

# ruff: noqa: F401  (the package re-exports its modules' public names)

from titan_core.compile.graph_trainer.capture import CapturedStep, CaptureError, StepLayout, capture_train_step
from titan_core.compile.graph_trainer.host_sync import HostSync, HostSyncError, host_sync_nodes
from titan_core.compile.graph_trainer.memory_policy import ActivationBytes, saved_activation_bytes
from titan_core.compile.graph_trainer.passes import build_pipeline, op_counts, registered_passes, run_passes
from titan_core.compile.graph_trainer.registry import PassSettings, register_pass
from titan_core.compile.graph_trainer.step_probes import find_host_syncs, graphs_per_step, measure_memory_policies
from titan_core.compile.graph_trainer.runner import GraphStats, GraphTrainStep
from titan_core.compile.graph_trainer.scan import ScanError, check_scannable
