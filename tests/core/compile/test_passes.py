"""The pass pipeline: registry, tiers, disabling by name, debug op counts, the contract."""

import pytest
import torch
from _tiny import batches, build

from titan_core.compile.graph_trainer import GraphTrainStep, build_pipeline, registered_passes
from titan_core.compile.graph_trainer.passes import DEFAULT_PIPELINE, NUMERICS_CHANGING_PIPELINE
from titan_core.config.loader import ConfigError
from titan_core.config.sections import GraphTrainer


def _one_step(**opts):
    model, opt = build("llama3")
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer(**opts))
    loss, _ = step.run(batches(1))
    return step, loss


@pytest.fixture(scope="module")
def reference():
    return _one_step()


def test_tiers_and_unknown_names():
    passes = registered_passes()
    assert all(not passes[n].numerics_changing for n in DEFAULT_PIPELINE)
    assert all(passes[n].numerics_changing for n in NUMERICS_CHANGING_PIPELINE)
    assert [p.name for p in build_pipeline()] == list(DEFAULT_PIPELINE)
    assert "matmul_bf16" in [p.name for p in build_pipeline(numerics_changing=True)]
    with pytest.raises(ConfigError, match="did you mean 'apply_recompute'"):
        build_pipeline(disable=["apply_recompte"])


def test_every_node_keeps_its_fake_value(reference):
    step, _ = reference
    missing = [
        n.name for n in step.captured.gm.graph.nodes if n.op in ("placeholder", "call_function") and "val" not in n.meta
    ]
    assert missing == []
    assert [r.name for r in step.stats.pass_records] == list(DEFAULT_PIPELINE)


def test_disable_and_debug(reference, capsys):
    _, ref_loss = reference
    step, loss = _one_step(disable_passes=("apply_recompute",), debug_passes=True)
    assert torch.equal(loss, ref_loss)
    assert "apply_recompute" not in [r.name for r in step.stats.pass_records]
    assert not any(n.meta.get("gt_recomputed") for n in step.captured.gm.graph.nodes)
    printed = capsys.readouterr().out
    assert "[graph pass] remove_detach:" in printed
    assert "aten.detach.default: " in printed and " -> 0" in printed


def test_numerics_changing_tier_is_opt_in(reference):
    ref_step, ref_loss = reference
    assert not any(
        n.meta["val"].dtype == torch.bfloat16
        for n in ref_step.captured.gm.graph.nodes
        if isinstance(n.meta.get("val"), torch.Tensor)
    )
    step, loss = _one_step(numerics_changing=True)
    rec = next(r for r in step.stats.pass_records if r.name == "matmul_bf16")
    assert rec.changed_ops["aten._to_copy.default"][1] > rec.changed_ops["aten._to_copy.default"][0]
    assert not torch.equal(loss, ref_loss)  # it does change numerics ...
    assert abs(loss.item() - ref_loss.item()) < 2e-2 * ref_loss.item()  # ... by bf16 rounding only


def test_view_to_reshape_runs_a_layout_the_trace_did_not_see_and_keeps_a_written_view():
    from torch.fx.experimental.proxy_tensor import make_fx

    from titan_core.compile.graph_trainer.passes import view_to_reshape
    from titan_core.compile.graph_trainer.registry import PassSettings

    # traced on a contiguous tensor; at run time the same values come transposed (a CPU kernel
    # that kept its input's layout), which `view` refuses
    gm = make_fx(lambda x: torch.ops.aten.view.default(x, [8]) * 2)(torch.randn(2, 4))
    x = torch.randn(4, 2, generator=torch.Generator().manual_seed(0)).t()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        gm(x)
    gm = view_to_reshape(gm, None, settings=PassSettings())
    gm.recompile()
    assert torch.equal(gm(x), x.reshape(8) * 2)

    def written(x):
        v = torch.ops.aten.view.default(x, [8])
        v.add_(1)  # through the view into x: a reshape's copy would lose the write
        return x

    gm = view_to_reshape(make_fx(written)(torch.zeros(2, 4)), None, settings=PassSettings())
    assert torch.ops.aten.view.default in {n.target for n in gm.graph.nodes}
