"""Parity's active-range machinery in isolation (onboard/parity/watch.py, active_range.py): what it
reads inside an upstream forward, what a config declares, and that the features pass's searches
bring an idle clamp, a zero buffer and flat attention scores into their active range. The planted
ports that fail because of them: tests/onboard/e2e/test_parity_plants.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onboard.parity import active_range, features
from onboard.parity.criteria import params
from onboard.parity.watch import ClampWatch, ScoreWatch, layer_of

pytestmark = pytest.mark.hf


class Clamping(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        y = self.inner(x)
        return y.clamp(min=-2.0, max=2.0) + torch.clamp(y, max=torch.tensor(0.5))  # a tensor bound: not a limit


def test_clamp_watch_counts_each_numeric_clamp_where_it_runs_and_leaves_outputs_alone():
    model = nn.Sequential(Clamping())
    x = torch.tensor([[3.0, -3.0, 1.0, 0.0]])
    with torch.no_grad():
        model[0].inner.weight.copy_(torch.eye(4))
        model[0].inner.bias.zero_()
        expected = model(x)
        watch = ClampWatch(model, sample=True)
        with watch:
            got = model(x)
        watch.close()
    assert torch.equal(got, expected)  # the module-stack hooks return nothing, so change nothing
    assert list(watch.sites) == [("0", -2.0, 2.0)]  # the tensor-bounded clamp is no config's limit
    site = watch.sites[("0", -2.0, 2.0)]
    assert (site.seen, site.clipped, site.bound()) == (4, 2, 2.0)
    assert site.quantile(1.0) == 3.0


def test_score_watch_spread_and_sink_mass():
    w = ScoreWatch()
    scores = torch.tensor([[[[0.0, 0.0, 0.0], [1.0, 3.0, 0.0], [5.0, 5.0, 5.0]]]])  # [B=1, H=1, 3, 3]
    valid = torch.ones(3, 3, dtype=torch.bool).tril()
    w.add(2, scores, valid, torch.tensor([0.0]))
    # row 0 sees one key (no spread), row 1 keys {1, 3} (std 1), row 2 keys {5, 5, 5} (std 0)
    assert w.layer_spread() == {2: pytest.approx(0.5)}
    lse = torch.tensor([0.0, torch.logsumexp(torch.tensor([1.0, 3.0]), 0).item(), 5.0 + torch.log(torch.tensor(3.0)).item()])
    assert w.layer_sink_mass()[2] == pytest.approx(float(torch.sigmoid(-lse).mean()))
    assert layer_of("model.layers.12.self_attn") == 12 and layer_of("model.norm") is None


def test_layer_kinds_and_config_numbers_from_transformers_configs():
    from transformers import GptOssConfig, LlamaConfig, SmolLM3Config

    smol = SmolLM3Config(num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], use_sliding_window=False)
    assert active_range.layer_kinds(smol) == ["RoPE full"] * 3 + ["NoPE full"]
    oss = GptOssConfig(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=32)
    assert active_range.layer_kinds(oss) == ["RoPE sliding", "RoPE full"]
    assert active_range.layer_kinds(LlamaConfig(num_hidden_layers=2)) == []
    numbers = active_range.config_numbers(oss)
    assert numbers["swiglu_limit"] == 7.0
    assert not {"rms_norm_eps", "vocab_size", "initializer_range", "hidden_size"} & set(numbers)


def _tiny_gpt_oss():
    from transformers import GptOssConfig

    from onboard.upstream.hf_model import causal_lm

    cfg = GptOssConfig(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"], rope_scaling=None,
    )  # fmt: skip
    torch.manual_seed(0)
    return causal_lm(cfg, attn_implementation="eager", dtype=torch.float32)


def test_the_features_pass_drives_an_idle_clamp_and_flat_scores_into_range():
    model = _tiny_gpt_oss()
    p = params()
    declared = features.declare(model.config)
    active_range.declare_model(model, declared)
    assert declared["attention_sinks"].declared and declared["layer_kinds"].declared
    tokens = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), features.Probe(model, declared) as probe:
        model(input_ids=tokens, use_cache=False)
    active_range.record_more(declared, probe, model, "seeded", p, "")
    clamp = declared["clamp_swiglu_limit"]
    assert clamp.declared and not clamp.exercised and clamp.value < p["feature_clamp_clipped_min"]
    assert "mlp.experts" in clamp.how
    assert not declared["layer_kinds"].exercised  # seeded scores barely spread
    from onboard.parity.feature_pass import prepare_feature_pass

    how = prepare_feature_pass(model, declared, tokens, p, seed=0)
    assert "gate/up weights of the clamping modules scaled" in how and "q/k projections x" in how
    with torch.no_grad(), features.Probe(model, declared) as probe:
        model(input_ids=tokens, use_cache=False)
    active_range.record_more(declared, probe, model, "features", p, f" ({how})")
    assert clamp.exercised and clamp.value >= p["feature_clamp_clipped_min"], clamp.how
    assert declared["layer_kinds"].exercised and declared["layer_kinds"].value >= p["feature_score_spread_min"]
    assert declared["attention_sinks"].exercised, declared["attention_sinks"].how
    assert any(line.startswith("clamp_swiglu_limit (features): ") for line in active_range.feature_summary(declared))


def test_a_zero_buffer_is_declared_and_drawn_in_the_features_pass():
    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 8))
            self.register_buffer("e_score_correction_bias", torch.zeros(4))
            self.register_buffer("scratch", torch.zeros(4), persistent=False)  # not in the checkpoint

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Module()])
            self.layers[0].gate = Router()
            self.config = None

    model = Tiny()
    declared: dict = {}
    zeros = [k for k, v in model.state_dict().items() if v.is_floating_point() and not bool(v.any())]
    assert zeros == ["layers.0.gate.e_score_correction_bias"]
    declared["zero_tensors"] = features.Feature("zero_tensors", "zero", True, config={"tensors": active_range.fold(zeros)})
    how = active_range.draw_zeros(model, declared, seed=0, params=params())
    assert how == f"1 zero tensors drawn from N(0, {params()['feature_zero_std']:g})"
    bias = model.layers[0].gate.e_score_correction_bias
    assert bool(bias.any()) and float(bias.std()) < 0.1
    assert not bool(model.layers[0].gate.scratch.any())
    active_range._record_zeros(declared["zero_tensors"], model, "features", "")
    assert declared["zero_tensors"].exercised and declared["zero_tensors"].value == 1


def test_a_consumed_limit_key_no_clamp_ran_with_is_idle():
    from transformers import GptOssConfig

    cfg = GptOssConfig(num_hidden_layers=2, swiglu_limit=7.0)
    found = {"clamp_swiglu_limit": features.Feature("clamp_swiglu_limit", "clamp", True)}
    assert active_range.unreached_keys(cfg, found, []) == []
    (line,) = active_range.unreached_keys(cfg, {}, [])
    assert line.startswith("swiglu_limit (the config sets 7.0") and "no parity pass reached it" in line
    assert active_range.unreached_keys(cfg, {}, ["swiglu_limit"]) == []  # the port does not read it: not its claim
