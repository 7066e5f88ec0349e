"""Scan over layers and the forward/backward split: same losses and weights as the plain capture."""

import pytest
import torch
from _tiny import batches, build

from titan_core.compile.graph_trainer import GraphTrainStep, ScanError, saved_activation_bytes
from titan_core.config.sections import GraphTrainer


def _train(family, steps=2, **opts):
    model, opt = build(family)
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer(**opts))
    losses = [step.run([b])[0] for b in batches(steps)]
    return step, losses, [p.detach() for p in model.parameters()]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def unrolled():
    return _train("llama3")


def test_scan_equals_unrolled(unrolled):
    _, ref_losses, ref_params = unrolled
    step, losses, params = _train("llama3", scan_layers=True)
    assert losses == ref_losses and _same(params, ref_params)
    gm = step.captured.gm
    scans = [n for n in gm.graph.nodes if n.op == "call_function" and "scan" in str(n.target)]
    assert scans  # the blocks run inside a scan ...
    # ... so the top-level graph holds no per-layer attention (it lives once, in the body)
    assert not any("flash_attention" in str(n.target) for n in gm.graph.nodes)
    assert step.stats.programs_per_step == [1, 1]
    # AdamW runs once per stack of same-named block weights, not once per layer
    n_params = len(ref_params)  # 21: 3 outside the blocks + 2 layers x 9
    lerps = sum(n.target is torch.ops.aten.lerp.Scalar for n in gm.graph.nodes)
    assert lerps == 3 + 9 < n_params


def test_scan_refuses_different_blocks():
    model, opt = build("glimmer")  # layer 0 windowed with RoPE, layer 1 global without
    # refused when the step is built, before a run has written anything
    with pytest.raises(ScanError, match="layer 1 differs from layer 0 at attention"):
        GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer(scan_layers=True))


def test_split_equals_unsplit(unrolled):
    _, ref_losses, ref_params = unrolled
    step, losses, params = _train("llama3", split=True)
    assert losses == ref_losses and _same(params, ref_params)
    assert step.stats.programs_per_step == [2, 2]  # forward program, then backward + optimizer
    moved = step.split.saved_bytes
    assert moved > 0 and moved == saved_activation_bytes(step.captured.gm).device
    assert not any(
        n.meta.get("gt_region") != "forward" for n in step.split.forward.graph.nodes if n.op == "call_function"
    )
