"""Localisation: module correspondence from the adapter, hooks, first divergence, attribution."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onboard.parity.localise import (
    OutputRecorder, attribute, compare_outputs, first_divergence, module_pairs, parameter_sources,
)  # fmt: skip

pytestmark = pytest.mark.hf


def _tiny_hf_moe():
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, vocab_size=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        mlp_only_layers=[1], tie_word_embeddings=True,
    )  # fmt: skip
    return cfg, AutoModelForCausalLM.from_config(cfg)


def test_pairs_follow_the_adapter_through_fused_experts_and_tied_head():
    from titan_core.models import build_meta, get_family

    cfg, hf = _tiny_hf_moe()
    family = get_family("qwen3_moe")
    args, _ = family.adapter.args_from_hf(cfg.to_dict())
    native = build_meta("qwen3_moe", args)
    sources = parameter_sources(hf.state_dict(), family.adapter.from_hf)
    # a split of a fused tensor keeps its source; the tied head adds no second source
    assert sources["layers.0.moe.experts.w1"] == {"model.layers.0.mlp.experts.gate_up_proj"}
    assert sources["layers.0.moe.experts.w3"] == {"model.layers.0.mlp.experts.gate_up_proj"}
    assert sources["tok_embeddings.weight"] == {"model.embed_tokens.weight"}
    pairs = module_pairs(native, hf, sources)
    expected = {
        "tok_embeddings": "model.embed_tokens",
        "layers.0": "model.layers.0",
        "layers.0.attention": "model.layers.0.self_attn",
        "layers.0.attention.wq": "model.layers.0.self_attn.q_proj",
        "layers.0.attention.q_norm": "model.layers.0.self_attn.q_norm",
        "layers.0.attention_norm": "model.layers.0.input_layernorm",
        "layers.0.moe": "model.layers.0.mlp",
        "layers.0.moe.router.gate": "model.layers.0.mlp.gate",  # the deepest of router / router.gate
        "layers.0.moe.experts": "model.layers.0.mlp.experts",
        "layers.1.feed_forward": "model.layers.1.mlp",
        "layers.1.feed_forward.w1": "model.layers.1.mlp.gate_proj",
        "norm": "model.norm",
    }
    assert expected.items() <= pairs.items()
    assert "layers.0.moe.router" not in pairs and "layers" not in pairs


class Block(nn.Module):
    def __init__(self, scale: float, inplace: bool = False):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.scale, self.inplace = scale, inplace

    def forward(self, x):
        y = self.a(x)
        y = y.mul_(self.scale) if self.inplace else y * self.scale  # the un-parameterised step between a and b
        return self.b(y)


class Toy(nn.Module):
    def __init__(self, scale: float = 1.0, inplace: bool = False):
        super().__init__()
        self.blk = Block(scale, inplace)

    def forward(self, x):
        return self.blk(x)


PAIRS = {"blk": "blk", "blk.a": "blk.a", "blk.b": "blk.b"}


def _run(native: nn.Module, upstream: nn.Module):
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), OutputRecorder(native, list(PAIRS)) as n, OutputRecorder(upstream, list(PAIRS.values())) as u:
        native(x), upstream(x)
    rows = compare_outputs(n, u, PAIRS)
    return rows, n, u


def test_error_between_compared_modules_is_blamed_on_the_enclosing_module():
    native, upstream = Toy(1.0), Toy(2.0)
    upstream.load_state_dict(native.state_dict())
    rows, n, u = _run(native, upstream)
    assert [r.native for r in rows] == ["blk.a", "blk.b", "blk"]  # completion order
    first = first_divergence(rows, 1e-5)
    assert first.native == "blk.b"  # its output is the first to differ...
    blamed, why = attribute(first, rows, n, u, PAIRS, 1e-5)
    assert blamed.native == "blk" and "input of blk.b already differs" in why  # ...but its input did too


def test_wrong_weight_is_blamed_on_its_own_module():
    native, upstream = Toy(), Toy()
    upstream.load_state_dict(native.state_dict())
    with torch.no_grad():
        native.blk.b.weight.copy_(native.blk.b.weight.t().clone())
    rows, n, u = _run(native, upstream)
    blamed, why = attribute(first_divergence(rows, 1e-5), rows, n, u, PAIRS, 1e-5)
    assert blamed.native == "blk.b" and "same input" in why


def test_agreeing_models_have_no_divergence_and_in_place_edits_are_not_compared():
    native, upstream = Toy(), Toy()
    upstream.load_state_dict(native.state_dict())
    rows, _, _ = _run(native, upstream)
    assert first_divergence(rows, 1e-5) is None and all(r.rel_l2 == 0.0 for r in rows)
    native, upstream = Toy(2.0, inplace=True), Toy(2.0, inplace=True)
    upstream.load_state_dict(native.state_dict())
    rows, _, _ = _run(native, upstream)
    a = next(r for r in rows if r.native == "blk.a")
    assert a.rel_l2 is None and "in place" in a.note  # the recorded output no longer is what a returned
