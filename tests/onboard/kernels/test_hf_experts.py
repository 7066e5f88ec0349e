"""titan_core's experts kernels under transformers' MoE blocks (titan_core/models/transformers/experts.py):
each kernel computes what transformers' own experts module computes (its eager per-expert loop),
fp32, on fresh random routing with every expert used and with one idle; the state dict keeps
transformers' names; an experts module of another structure is left alone and a kernel on it
refused; a tiny qwen3_moe on this path captures in the Graph Trainer bit-identically to eager."""

from __future__ import annotations

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

from titan_core.models.common.swaps import SwapNotApplicable, apply_swaps
from titan_core.models.registry import build_meta
from titan_core.measure.numerics import rel_l2

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=256, max_position_embeddings=256, num_experts_per_tok=2)  # fmt: skip
CONFIGS = {
    "qwen3_moe": dict(TINY, intermediate_size=128, moe_intermediate_size=32, num_experts=4),
    "mixtral": dict(TINY, intermediate_size=32, num_local_experts=4),
}
SWAPS = {"loop": [], "dense": ["moe.dense"], "grouped_mm": ["moe.grouped_mm"]}
TOKENS = 48
TOL = 1e-6


def _args(model_type: str, **more):
    from titan_core.models.transformers import ADAPTER

    return ADAPTER.args_from_hf({"model_type": model_type, **CONFIGS[model_type], **more})[0]


def _model(model_type: str, kernel: str = "loop", **more):
    import titan_core.kernels  # noqa: F401  (registers the moe.* swaps)

    model = build_meta("transformers", _args(model_type, **more))
    apply_swaps(model, SWAPS[kernel])
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model


def _routing(n_experts: int, top_k: int, *, idle: int | None, seed: int):
    """(top_k_index, top_k_weights) [TOKENS, top_k]: distinct experts per token, each expert used
    unless it is `idle`, which no token chooses."""
    gen = torch.Generator().manual_seed(seed)
    pool = [e for e in range(n_experts) if e != idle]
    index = torch.stack([torch.tensor(pool)[torch.randperm(len(pool), generator=gen)[:top_k]] for _ in range(TOKENS)])
    used = set(index.flatten().tolist())
    assert used == set(pool)  # every expert but the idle one receives tokens
    weights = torch.rand(TOKENS, top_k, generator=gen).softmax(-1)
    return index, weights


def _hf_reference(experts: torch.nn.Module) -> torch.nn.Module:
    """transformers' own experts module of the same class and weights."""
    hf_cls = next(c for c in type(experts).__mro__[1:] if c.__module__.startswith("transformers."))
    ref = hf_cls(experts.config)
    ref.load_state_dict(experts.state_dict(), strict=True)
    return ref


def _run(fn, params, x, index, weights):
    x = x.clone().requires_grad_()
    out = fn(x, index, weights)
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), [x, *params])
    return out.detach(), grads


@pytest.mark.parametrize("idle", [None, 1], ids=["all_experts", "one_idle"])
@pytest.mark.parametrize("kernel", list(SWAPS))
@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_kernel_equals_transformers_experts(model_type, kernel, idle):
    model = _model(model_type, kernel)
    experts = model.model.layers[0].mlp.experts
    assert (
        type(experts.kernel).__name__
        == {"loop": "Experts", "dense": "DenseExperts", "grouped_mm": "GroupedMMExperts"}[kernel]
    )
    ref = _hf_reference(experts)
    eager = type(ref).forward.__wrapped__  # transformers' per-expert loop, whatever implementation is configured
    n, k = experts.gate_up_proj.shape[0], CONFIGS[model_type]["num_experts_per_tok"]
    index, weights = _routing(n, k, idle=idle, seed=7 + (idle or 0))
    x = torch.randn(TOKENS, TINY["hidden_size"], generator=torch.Generator().manual_seed(1))
    got, g_grads = _run(experts, [experts.gate_up_proj, experts.down_proj], x, index, weights)
    want, w_grads = _run(lambda *a: eager(ref, *a), [ref.gate_up_proj, ref.down_proj], x, index, weights)
    assert want.abs().sum() > 0
    errs = [rel_l2(got, want)] + [rel_l2(g, w) for g, w in zip(g_grads, w_grads)]
    assert max(errs) <= TOL, errs  # output, then the gradients of the input, gate_up_proj, down_proj
    if idle is not None:  # the idle expert gets no gradient, as in transformers' loop
        assert g_grads[1][idle].abs().sum() == 0 and g_grads[2][idle].abs().sum() == 0


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_state_dict_keeps_transformers_names(model_type):
    from titan_core.models.transformers.hf_classes import causal_lm_class, config_object

    config = config_object({"model_type": model_type, **CONFIGS[model_type]})
    with torch.device("meta"):
        plain = causal_lm_class(config)._from_config(config)
    want = {k: tuple(v.shape) for k, v in plain.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in want
    for kernel, swaps in SWAPS.items():
        model = build_meta("transformers", _args(model_type))
        apply_swaps(model, swaps)
        assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == want, kernel
        assert model.experts_install.installed == ["0.mlp.experts", "1.mlp.experts"]


def _rows(ctx_log, flag, build):
    from onboard.rungs.kernels_rung import rung as kernels

    ctx = type("Ctx", (), {"log": staticmethod(ctx_log.append)})()
    return kernels._one_kernel(ctx, flag, build=build, criteria=kernels.tolerances(), mode_kw={})


def test_unusual_experts_stay_transformers_own_and_a_kernel_is_refused():
    """Experts with another activation (gelu): not the kernels' SwiGLU, so left as transformers' class;
    kernels.moe = dense on them is refused with the path and class, which the kernels rung reports as
    not applicable; the default runs transformers' own module."""
    from onboard.rungs.kernels_rung.compare import compare_kernel
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    args = _args("qwen3_moe", hidden_act="gelu")
    model = build_meta("transformers", args)
    assert type(model.model.layers[0].mlp.experts) is Qwen3MoeExperts and not model.experts_install.installed
    assert "activation is GELUActivation" in model.experts_install.refusal
    with pytest.raises(
        SwapNotApplicable,
        match=r"is Qwen3MoeExperts, not one of the classes swap 'moe.dense'"
        r".*\(.*activation is GELUActivation",
    ):
        apply_swaps(model, ["moe.dense"])
    build = dict(family="transformers", args=args, device="cpu", batch=1, seq_len=16)
    with pytest.raises(SwapNotApplicable):
        compare_kernel(flag="kernels.moe=dense", **build)
    row = _rows([], "kernels.moe=dense", build)
    assert row["status"] == "not_applicable" and "Qwen3MoeExperts" in row["reason"]


def test_gpt_oss_experts_layout_is_not_the_usual_one():
    from titan_core.models.transformers.hf_classes import causal_lm_class, config_object
    from titan_core.models.transformers.experts import install_experts

    config = config_object({"model_type": "gpt_oss", **TINY, "intermediate_size": 32, "num_local_experts": 4})
    with torch.device("meta"):
        hf = causal_lm_class(config)._from_config(config)
    done = install_experts(hf.model.layers, "model.layers")
    assert not done.installed and done.swap_pattern == "model.layers.*.mlp.experts"
    assert "has_bias=True, is_transposed=True" in done.refusal


def _trainer(tmp_path, name: str, *flags: str):
    import json

    from titan_core.config import load_config
    from titan_core.training.trainer import Trainer

    cfg_json = tmp_path / "config.json"
    cfg_json.write_text(json.dumps({"model_type": "qwen3_moe", **CONFIGS["qwen3_moe"]}))
    cfg = load_config(None, [
        "--model.family=transformers", f"--model.hf_config={cfg_json}", "--kernels.moe=dense",
        "--training.batch_size=2", "--training.seq_len=32", "--training.steps=2", "--training.deterministic",
        "--device.type=cpu", "--optimizer.lr=3e-3", "--lr_scheduler.warmup_steps=1", "--metrics.rich=false",
        "--parallelism.data_parallel=none", f"--metrics.output_dir={tmp_path / name}", *flags,
    ])  # fmt: skip
    t = Trainer(cfg, quiet=True)
    return t, t.train().metrics


def test_graph_trainer_captures_qwen3_moe_bit_identical_to_eager(tmp_path):
    eager, e_rows = _trainer(tmp_path, "eager")
    graph, g_rows = _trainer(tmp_path, "graph", "--graph_trainer.enable")
    assert "model.layers.0.mlp.experts.kernel" in graph.swaps  # the dense experts really run
    assert type(graph.model.model.layers[0].mlp.experts.kernel).__name__ == "DenseExperts"
    assert [r["loss"] for r in g_rows] == [r["loss"] for r in e_rows]  # exact floats, every step
    assert [r["grad_norm"] for r in g_rows] == [r["grad_norm"] for r in e_rows]
    assert e_rows[-1]["loss"] != e_rows[0]["loss"]
    assert all(torch.equal(p, q) for p, q in zip(eager.model.parameters(), graph.model.parameters()))
    assert graph.graph_step.stats.captures == 1 and graph.graph_step.stats.host_syncs == []


def test_experts_left_as_transformers_wrote_them_run_batched_mm_and_capture():
    # GELU experts are not the kernels' structure: they stay transformers' own, on its static-shape
    # batched_mm, which the Graph Trainer's fake tracing runs in fp32 (grouped_mm's fake kernel
    # takes bf16 only) and per-block compile takes whole
    from titan_core.compile.graph_trainer import GraphTrainStep
    from titan_core.config.sections import GraphTrainer
    from titan_core.data import Batch
    from titan_core.models.transformers.model import OWN_EXPERTS

    model = _model("qwen3_moe", hidden_act="gelu")
    assert model.experts_install.refusal and model.hf.config._experts_implementation == OWN_EXPERTS == "batched_mm"
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    eager, _ = model.loss(tokens, tokens)
    step = GraphTrainStep(
        model, torch.optim.AdamW(model.parameters(), lr=0.0), max_norm=1.0, grad_accum=1, config=GraphTrainer()
    )
    loss, _ = step.run([Batch(tokens, tokens)])
    assert torch.equal(loss, eager.detach())


def test_a_frozen_parameter_is_left_out_of_the_kernel_comparison():
    # AFMoE keeps its router bias as a parameter that does not require grad: not a gradient to compare
    args = _args("qwen3_moe")
    build = dict(family="transformers", args=args, device="cpu", batch=1, seq_len=16)

    def frozen_model():
        model = build_meta("transformers", args)
        model.model.norm.weight.requires_grad_(False)
        return model

    from onboard.rungs.kernels_rung.compare import compare_kernel

    got = compare_kernel(flag="kernels.loss=fused_ce", build_meta_model=frozen_model, **build)
    assert "model.norm.weight" not in got.grad_rel_err and "lm_head.weight" in got.grad_rel_err
    assert got.max_grad_rel_err <= 1e-5
