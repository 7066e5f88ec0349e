"""No host sync inside the captured step: a clean step has none, and adding one is caught."""

import pytest
import torch
from _tiny import batches, build
from torch import nn

from titan_core.compile.graph_trainer import (
    GraphTrainStep,
    HostSyncError,
    find_host_syncs,
)
from titan_core.config.sections import GraphTrainer


class ItemNorm(nn.Module):
    """A final norm that reads a device value on the host: the kind of line that slips in."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        scale = x.abs().amax().item()  # the host sync under test
        return self.inner(x) * (1.0 if scale > 0 else 0.0)


def _capture(model, opt, **opts):
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer(**opts))
    step.capture(batches(1))
    return step


def test_clean_step_has_no_host_sync():
    model, opt = build("llama3")
    assert find_host_syncs(model, opt, batches(1)) == []
    model, opt = build("qwen3_moe")  # dense, static-shape experts
    assert find_host_syncs(model, opt, batches(1)) == []


def test_an_added_item_fails_the_capture_at_its_line():
    model, opt = build("llama3")
    model.norm = ItemNorm(model.norm)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(HostSyncError, match=r"_local_scalar_dense[\s\S]*test_host_sync.py:\d+ in forward"):
        _capture(model, opt)
    found = find_host_syncs(model, opt, batches(1))
    assert len(found) == 1 and "item" in found[0].why and "test_host_sync.py" in found[0].where


def test_reference_moe_loop_is_reported_with_the_fix():
    """torch.where per expert has a data-dependent shape: a sync on device, a break in a graph."""
    model, opt = build("qwen3_moe", dense_moe=False)
    with pytest.raises(HostSyncError, match=r"nonzero[\s\S]*kernels.moe=dense"):
        _capture(model, opt)
    found = find_host_syncs(model, opt, batches(1))
    # one torch.where per expert per MoE layer, in the forward
    assert sum(s.op == "aten.nonzero.default" for s in found) == 4 * 2
