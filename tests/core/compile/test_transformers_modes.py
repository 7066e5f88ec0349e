"""The Graph Trainer's modes on the transformers path (transformers' own class run by titan_core):
every memory policy, the forward/backward split and scan over layers give the unrolled,
unsplit capture's losses and weights exactly; scan refuses blocks that differ, naming the field."""

from __future__ import annotations

import pytest
import torch
from _tiny import batches

from titan_core.compile.graph_trainer import GraphTrainStep, ScanError, saved_activation_bytes
from titan_core.config import ConfigError
from titan_core.config.sections import GraphTrainer, Optimizer
from titan_core.models.registry import build_meta
from titan_core.training.optim import build_optimizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256, max_position_embeddings=256)  # fmt: skip


def _build(config):
    from titan_core.models.transformers import ADAPTER

    args, _ = ADAPTER.args_from_hf(config.to_dict())
    model = build_meta("transformers", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model, build_optimizer(model, Optimizer(lr=3e-3))


def _train(steps=2, config=None, **opts):
    model, opt = _build(config or transformers.LlamaConfig(**BASE))
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer(**opts))
    losses = [step.run([b])[0] for b in batches(steps)]
    return step, losses, [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def unrolled():
    return _train(memory_policy="default", disable_passes=["apply_recompute", "apply_offload"])


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["default", "full", "offload"])
def test_memory_policies_equal_saving_everything(unrolled, policy):
    _, ref_losses, ref_params = unrolled
    step, losses, params = _train(memory_policy=policy)
    assert losses == ref_losses and _same(params, ref_params)
    tags = [n.meta.get("gt_policy") for n in step.captured.gm.graph.nodes]
    # the block tags reach transformers' decoder layers, so the policies have boundaries to keep
    assert any(n.meta.get("gt_layer") == 1 for n in step.captured.gm.graph.nodes)
    assert ("recompute" in tags) and (("offload" in tags) or policy != "offload")
    saved, kept = saved_activation_bytes(step.captured.gm), saved_activation_bytes(unrolled[0].captured.gm)
    assert saved.device < kept.device and (saved.host > 0) == (policy == "offload")


@pytest.mark.slow
def test_split_equals_unsplit(unrolled):
    _, ref_losses, ref_params = unrolled
    step, losses, params = _train(split=True)
    assert losses == ref_losses and _same(params, ref_params)
    assert step.stats.programs_per_step == [2, 2] and step.split.saved_bytes > 0


def test_scan_equals_unrolled(unrolled):
    _, ref_losses, ref_params = unrolled
    step, losses, params = _train(scan_layers=True)
    assert losses == ref_losses and _same(params, ref_params)
    gm = step.captured.gm
    assert any("scan" in str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert not any("attention" in str(n.target) for n in gm.graph.nodes)  # the block lives once, in the body
    # after the step the model's own loop holds its blocks again
    assert len(step.model.model.layers) == 2


def test_transformers_blocks_differ_only_by_their_cache_index():
    from titan_core.compile.graph_trainer.scan import _index_only_for_cache, check_scannable

    model, _ = _build(transformers.LlamaConfig(**BASE))
    assert check_scannable(model)[0] == "self_attn.q_proj.weight"
    assert [b.self_attn.layer_idx for b in model.layers.values()] == [0, 1]  # ignored: read for the cache only
    assert _index_only_for_cache(type(model.layers["0"].self_attn))

    class ScalesByDepth(torch.nn.Module):  # gpt2's scale_attn_by_inverse_layer_idx, read in forward
        def forward(self, x):
            return x / float(self.layer_idx + 1)

    assert not _index_only_for_cache(ScalesByDepth)


def test_scan_refuses_gemma2_sliding_and_global_layers():
    cfg = transformers.Gemma2Config(**BASE, head_dim=16, sliding_window=8)
    with pytest.raises(ScanError, match=r"layer 1 differs from layer 0 at self_attn\.\w+: .* vs ") as e:
        _train(steps=1, config=cfg, scan_layers=True)
    assert isinstance(e.value, ConfigError) and "\n" not in str(e.value)
