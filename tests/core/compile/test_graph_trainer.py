"""Graph Trainer end to end through the Trainer: one captured program per step, bit-identical to eager."""

import pytest
import torch
from _tiny import FAMILIES, batches, build, same_params, tiny_cfg

from titan_core.compile.graph_trainer import GraphTrainStep
from titan_core.config.loader import ConfigError
from titan_core.config.sections import GraphTrainer
from titan_core.training.trainer import Trainer


def _run(cfg):
    t = Trainer(cfg, quiet=True)
    result = t.train()
    return t, [m["loss"] for m in result.metrics], [m["grad_norm"] for m in result.metrics]


@pytest.mark.parametrize("family", FAMILIES)
def test_three_steps_bit_identical_to_eager(tmp_path, family):
    eager, e_loss, e_norm = _run(tiny_cfg(family, tmp_path / "e", "--parallelism.data_parallel=none"))
    graph, g_loss, g_norm = _run(
        tiny_cfg(family, tmp_path / "g", "--parallelism.data_parallel=none", "--graph_trainer.enable")
    )
    assert g_loss == e_loss and g_norm == e_norm  # exact floats, every step
    assert e_loss[-1] != e_loss[0]  # the weights did move
    assert same_params(eager.model, graph.model)
    for p, q in zip(eager.model.parameters(), graph.model.parameters()):
        se, sg = eager.optimizer.state[p], graph.optimizer.state[q]
        assert torch.equal(se["exp_avg"], sg["exp_avg"]) and torch.equal(se["exp_avg_sq"], sg["exp_avg_sq"])
        assert torch.equal(se["step"], sg["step"])
    stats = graph.graph_step.stats
    assert stats.captures == 1  # traced once, reused by steps 2 and 3
    assert stats.programs_per_step == [1, 1, 1]  # exactly one graph per step
    assert stats.host_syncs == []


def test_simple_fsdp_world_size_1_and_grad_accum(tmp_path):
    """The default data-parallel path (SimpleFSDP DTensors at world size 1), two micro-batches."""
    extra = ("--training.grad_accum=2", "--training.batch_size=2")
    eager, e_loss, _ = _run(tiny_cfg("llama3", tmp_path / "e", *extra))
    graph, g_loss, _ = _run(tiny_cfg("llama3", tmp_path / "g", *extra, "--graph_trainer.enable"))
    assert eager.cfg.parallelism.data_parallel == "simple_fsdp"
    assert g_loss == e_loss
    assert same_params(eager.model, graph.model)


def test_parameters_are_graph_inputs_not_constants():
    """Perturb the weights after capture: the captured program must see the new values."""
    model, opt = build("llama3")
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer())
    (b,) = batches(1)
    step.capture([b])
    flat = step.inputs([b])
    base = step.captured.gm(*flat)[0]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    perturbed = step.captured.gm(*step.inputs([b]))[0]
    with torch.no_grad():
        want, _ = model.loss(b.tokens, b.labels)
    assert not torch.equal(perturbed, base)
    assert torch.equal(perturbed, want)
    assert len([n for n in step.captured.gm.graph.nodes if n.op == "placeholder"]) == len(flat)


def test_a_frozen_parameter_is_a_graph_input_and_the_step_matches_eager():
    """A parameter that does not require grad (AFMoE's router bias) is read, not updated: it enters
    the graph as an input (not a real-tensor constant, which fake tracing refuses), and a change
    to it after capture reaches the captured program."""
    model, opt = build("llama3")
    frozen = model.norm.weight
    frozen.requires_grad_(False)
    opt.param_groups[0]["params"] = [p for p in opt.param_groups[0]["params"] if p is not frozen]
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer())
    (b,) = batches(1)
    step.capture([b])
    assert "norm.weight" in step.layout.buffer_names and "norm.weight" not in step.layout.param_names
    with torch.no_grad():
        frozen.mul_(1.5)
        want, _ = model.loss(b.tokens, b.labels)
    assert torch.equal(step.captured.gm(*step.inputs([b]))[0], want)


def test_a_parameter_the_loss_does_not_use_passes_through_and_changes_nothing_else():
    """A trainable parameter without a gradient (a causal LM's unused cross-attention, a pooler):
    eager's AdamW and norm skip it, and so does the captured step; the others move exactly as in
    the same model without it."""

    def three_steps(unused: torch.Tensor | None):
        model, _ = build("llama3")
        if unused is not None:
            model.unused = torch.nn.Parameter(unused.clone())
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer())
        losses = [step.run([b])[0] for b in batches(3)]
        return model, opt, losses

    plain, _, want = three_steps(None)
    start = torch.randn(8)
    model, opt, got = three_steps(start)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    ours = [p for n, p in model.named_parameters() if n != "unused"]
    assert all(torch.equal(p, q) for p, q in zip(ours, plain.parameters()))
    assert torch.equal(model.unused, start)  # passed through, as eager's AdamW leaves it
    state = opt.state[model.unused]
    assert not state or (not state["exp_avg"].any() and not state["exp_avg_sq"].any())


def test_both_execution_modes_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="pick one"):
        Trainer(
            tiny_cfg(
                "llama3", tmp_path, "--parallelism.data_parallel=none", "--graph_trainer.enable", "--compile.enable"
            ),
            quiet=True,
        )
