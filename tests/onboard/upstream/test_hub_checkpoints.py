"""Checkpoints as the Hub ships them, checked from their headers on the transformers path.

The checkpoints are written here with safetensors, by name, from the config's own numbers (not
through transformers' conversion, which is what is under test): Mixtral's per-expert
`block_sparse_moe.experts.{e}.w1/w2/w3.weight`, which transformers 5 holds in memory as one
stacked `mlp.experts.gate_up_proj` and `down_proj`, and an old `rotary_emb.inv_freq` per layer.
"""

from __future__ import annotations

import json

import pytest
import torch

from onboard.upstream.weights_headers import check_checkpoint_headers
from test_checkpoint_headers import assert_only, check, hf_state_dict, write_real
from titan_core.models.transformers import ADAPTER, DEBUG_HF_CONFIG, TransformersCausalLM
from titan_core.models.transformers.checkpoint_layout import CheckpointLayout

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

BF16 = {"dtype": torch.bfloat16}
TINY_MIXTRAL = transformers.MixtralConfig(
    hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=64, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
)  # fmt: skip


def config_dict(config) -> dict:
    """config.json as a user has it, with no dtype declared (the Hub's older files often lack it)."""
    out = config.to_dict()
    for key in ("dtype", "torch_dtype"):
        out.pop(key, None)
    return out


def meta_model(cfg: dict) -> TransformersCausalLM:
    args, _ = ADAPTER.args_from_hf(cfg)
    with torch.device("meta"):
        return TransformersCausalLM(args)


def mixtral_hub_checkpoint(c) -> dict[str, torch.Tensor]:
    """Every tensor of Mixtral in the Hub's layout, bf16, shapes from the config's numbers."""
    d, i, hd = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    heads, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    sd = {
        "model.embed_tokens.weight": torch.randn(c.vocab_size, d, **BF16),
        "model.norm.weight": torch.ones(d, **BF16),
        "lm_head.weight": torch.randn(c.vocab_size, d, **BF16),
    }
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        sd.update({
            p + "self_attn.q_proj.weight": torch.randn(heads, d, **BF16),
            p + "self_attn.k_proj.weight": torch.randn(kv, d, **BF16),
            p + "self_attn.v_proj.weight": torch.randn(kv, d, **BF16),
            p + "self_attn.o_proj.weight": torch.randn(d, heads, **BF16),
            p + "input_layernorm.weight": torch.ones(d, **BF16),
            p + "post_attention_layernorm.weight": torch.ones(d, **BF16),
            p + "block_sparse_moe.gate.weight": torch.randn(c.num_local_experts, d, **BF16),
        })  # fmt: skip
        for e in range(c.num_local_experts):
            q = f"{p}block_sparse_moe.experts.{e}."
            sd.update({q + "w1.weight": torch.randn(i, d, **BF16), q + "w2.weight": torch.randn(d, i, **BF16),
                       q + "w3.weight": torch.randn(i, d, **BF16)})  # fmt: skip
    return sd


def write_hub(folder, sd: dict, config) -> object:
    write_real(folder, sd, shards=2, torch_dtype=None)
    (folder / "config.json").write_text(json.dumps(config_dict(config)))
    return folder


def test_mixtral_hub_layout_passes_on_the_transformers_path(tmp_path):
    c = TINY_MIXTRAL
    model = meta_model(config_dict(c))
    sd = mixtral_hub_checkpoint(c)
    for layer in range(c.num_hidden_layers):  # an old checkpoint's rotary buffers, fp32 beside bf16 weights
        sd[f"model.layers.{layer}.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    report = check_checkpoint_headers(write_hub(tmp_path / "w", sd, c), model, ADAPTER)
    assert report.ok, report.to_dict()
    assert report.tensors == 3 + c.num_hidden_layers * (7 + 3 * c.num_local_experts + 1)
    assert report.dtype_expected == "bfloat16" and report.dtype_source.startswith("the checkpoint's headers")
    # what the check compared: transformers' stacked layout, [E, 2I, D] and [E, D, I]
    meta = {k: v.to("meta") for k, v in sd.items()}
    mapped = CheckpointLayout(model.hf).from_hf(meta)
    assert tuple(mapped["model.layers.1.mlp.experts.gate_up_proj"].shape) == (4, 96, 32)
    assert tuple(mapped["model.layers.1.mlp.experts.down_proj"].shape) == (4, 32, 48)
    assert set(mapped) == set(model.state_dict())  # the inv_freq buffers left out, as transformers does


def test_mixtral_hub_layout_short_of_an_expert_names_its_stack(tmp_path):
    c = TINY_MIXTRAL
    sd = mixtral_hub_checkpoint(c)
    dropped = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    del sd[dropped]
    report = check_checkpoint_headers(write_hub(tmp_path / "w", sd, c), meta_model(config_dict(c)), ADAPTER)
    assert not report.ok and not report.wrong_shape and not report.wrong_dtype
    (missing,) = report.missing  # the stack the 7 tensors cannot make; down_proj still maps
    assert missing["native"] == "model.layers.1.mlp.experts.gate_up_proj" and dropped in missing["hf"]
    (extra,) = report.extra
    assert "Sizes of tensors must match" in extra["why"] and len(extra["hf"]) == 7


def test_an_unknown_tensor_or_dtype_still_fails_beside_inv_freq(tmp_path):
    c = TINY_MIXTRAL
    sd = mixtral_hub_checkpoint(c)
    sd["model.rotary_emb.inv_freq"] = torch.ones(4)  # ignored, as transformers ignores it
    sd["model.layers.0.self_attn.rotary_emb.freqs"] = torch.ones(4, **BF16)  # not a name transformers ignores
    report = check_checkpoint_headers(write_hub(tmp_path / "w", sd, c), meta_model(config_dict(c)), ADAPTER)
    assert_only(report, "extra")
    assert [e["hf"] for e in report.extra] == [["model.layers.0.self_attn.rotary_emb.freqs"]]
    sd = mixtral_hub_checkpoint(c)
    odd = "model.layers.0.block_sparse_moe.experts.3.w2.weight"
    sd[odd] = sd[odd].float()
    report = check_checkpoint_headers(write_hub(tmp_path / "d", sd, c), meta_model(config_dict(c)), ADAPTER)
    assert_only(report, "wrong_dtype")
    assert [(w["hf"], w["dtype"]) for w in report.wrong_dtype] == [([odd], "float32")]


def test_a_tied_checkpoint_without_its_head_passes_and_inv_freq_too(tmp_path):
    cfg = {**DEBUG_HF_CONFIG, "tie_word_embeddings": True}
    model = meta_model(cfg)
    sd = {k: torch.zeros(tuple(v.shape), **BF16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    folder = write_real(tmp_path / "w", sd, torch_dtype="bfloat16")
    report = check_checkpoint_headers(folder, model, ADAPTER)
    assert report.ok, report.to_dict()
    del sd["model.embed_tokens.weight"]  # the head has nothing to be tied to now
    report = check_checkpoint_headers(write_real(tmp_path / "x", sd), model, ADAPTER)
    assert sorted(m["native"] for m in report.missing) == ["lm_head.weight", "model.embed_tokens.weight"]
    untied = meta_model(DEBUG_HF_CONFIG)  # no tie: a head left out of the checkpoint is missing
    sd = {k: torch.zeros(tuple(v.shape), **BF16) for k, v in untied.state_dict().items() if k != "lm_head.weight"}
    report = check_checkpoint_headers(write_real(tmp_path / "u", sd), untied, ADAPTER)
    assert_only(report, "missing")
    assert [m["native"] for m in report.missing] == ["lm_head.weight"]


def test_inv_freq_passes_on_the_native_path_too(tmp_path):
    sd = hf_state_dict("llama3")
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)
    assert check(write_real(tmp_path / "w", sd), "llama3").ok
    sd["model.layers.0.self_attn.rotary_emb.other"] = torch.ones(16, **BF16)
    assert_only(check(write_real(tmp_path / "x", sd), "llama3"), "extra")


def test_one_weight_in_two_layouts_is_named_not_silently_kept_once(tmp_path):
    c = TINY_MIXTRAL
    sd = mixtral_hub_checkpoint(c)
    sd["model.layers.0.mlp.gate.weight"] = sd["model.layers.0.block_sparse_moe.gate.weight"].clone()
    report = check_checkpoint_headers(write_hub(tmp_path / "w", sd, c), meta_model(config_dict(c)), ADAPTER)
    assert_only(report, "extra")
    (extra,) = report.extra
    assert "both load into model.layers.0.mlp.gate.weight" in extra["why"]
    assert extra["hf"][0] in ("model.layers.0.mlp.gate.weight", "model.layers.0.block_sparse_moe.gate.weight")
