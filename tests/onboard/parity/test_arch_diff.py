"""Architecture differences the config keys cannot show: new-model --path port compares the
upstream HF decoder layer (built on meta from config.json) with the closest family's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from typer.testing import CliRunner

from onboard.workspace.arch_diff import architecture_differences
from onboard.cli.app import app
from onboard.workspace.scaffold import plan_workspace

NARROW = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=None)  # fmt: skip


def hf_config(model_type: str, **extra) -> dict:
    """A narrowed config.json of a model_type transformers ships, as its own config class writes it."""
    import transformers

    return transformers.AutoConfig.for_model(model_type, **{**NARROW, **extra}).to_dict()


def port_plan(tmp_path: Path, cfg: dict, name: str = "p"):
    path = tmp_path / f"{name}.config.json"
    path.write_text(json.dumps(cfg))
    return plan_workspace(name, tmp_path, hf_config=path, path="port", device="cpu")


@pytest.mark.hf
def test_olmo2_post_norms_and_full_width_qk_norm(tmp_path):
    plan = port_plan(tmp_path, hf_config("olmo2"))
    assert plan.family == "llama3" and plan.unconsumed == []  # the keys alone show nothing
    [norms, qk, post_ffn] = plan.arch_differences
    assert norms.startswith("norm placement: Olmo2DecoderLayer has post-attention")
    assert "post-MLP (on the MLP output) `post_feedforward_layernorm`" in norms
    assert "the llama3 Block has pre-attention `attention_norm`, pre-MLP `ffn_norm`" in norms
    assert qk.startswith("QK-norm: Olmo2DecoderLayer has QK-norm over the full width") and "[64]" in qk
    # the post-MLP norm's weight: a tensor llama3's key table has no name for (llama's
    # post_attention_layernorm it names, as its pre-MLP norm: the placement line says otherwise)
    assert post_ffn.startswith(
        "upstream tensor the llama3 adapter has no name for: `model.layers.{i}.post_feedforward_layernorm.weight` [64]"
        " (Olmo2RMSNorm, every layer); config keys: rms_norm_eps = 1e-05: a norm the llama3 family's Block lacks"
    )
    readme, model = plan.files["README.md"], plan.files["model.py"]
    assert "## Architecture differences the config keys cannot show" in readme and f"- {norms}" in readme
    assert "# TODO(port): architecture: norm placement: Olmo2DecoderLayer" in model
    assert "# TODO(port): architecture: QK-norm: Olmo2DecoderLayer has QK-norm over the full" in model


@pytest.mark.hf
def test_qwen2_moe_gated_shared_expert_bias_and_no_qk_norm(tmp_path):
    cfg = hf_config("qwen2_moe", num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64)
    plan = port_plan(tmp_path, cfg)
    assert plan.family == "qwen3_moe"
    diffs = plan.arch_differences
    assert any(
        d.startswith("QK-norm: Qwen2MoeDecoderLayer has no QK-norm; the qwen3_moe family has QK-norm per head")
        for d in diffs
    ), diffs
    assert any(d.startswith("gated shared expert:") and "`mlp.shared_expert_gate`" in d for d in diffs), diffs
    assert any(d.startswith("shared expert: Qwen2MoeDecoderLayer has `mlp.shared_expert`") for d in diffs), diffs
    assert any(d.startswith("q/k/v projection bias: Qwen2MoeDecoderLayer has one") for d in diffs), diffs
    assert not any(d.startswith("norm placement") for d in diffs), diffs  # same pre-norm layout as qwen3_moe


@pytest.mark.hf
def test_phi3_fused_projections_are_named(tmp_path):
    diff = architecture_differences(hf_config("phi3"), "llama3")
    [attn, mlp, qkv, gate_up] = diff.differences
    assert attn.startswith("attention projections: Phi3DecoderLayer has `self_attn.o_proj`, `self_attn.qkv_proj`")
    assert mlp.startswith("MLP projections: Phi3DecoderLayer has `mlp.down_proj`, `mlp.gate_up_proj`;")
    # and the weights the adapter must split, each with what to split it into
    assert qkv.startswith("upstream tensor the llama3 adapter has no name for: `model.layers.{i}.self_attn.qkv_proj")
    assert "splits its rows into wq [n_heads * head_dim] and wk, wv [n_kv_heads * head_dim]" in qkv
    assert "`model.layers.{i}.mlp.gate_up_proj.weight` [256, 64] (Phi3MLP, every layer)" in gate_up
    assert "chunk(2): gate first" in gate_up


@pytest.mark.hf
@pytest.mark.parametrize(
    "model_type, extra, family",
    [
        ("granite", {}, "llama3"),  # its differences are multipliers: config keys, listed as unconsumed
        ("qwen3_moe", dict(num_experts=4, moe_intermediate_size=32), "qwen3_moe"),  # the family's own upstream
        ("llama", {}, "llama3"),
    ],
)
def test_same_structure_lists_no_difference(tmp_path, model_type, extra, family):
    cfg = hf_config(model_type, **extra)
    diff = architecture_differences(cfg, family)
    assert (diff.differences, diff.note) == ([], None)


@pytest.mark.hf
def test_new_model_prints_and_returns_the_differences(tmp_path):
    path = tmp_path / "olmo2.json"
    path.write_text(json.dumps(hf_config("olmo2")))
    result = CliRunner().invoke(
        app, ["new-model", "o", "--hf-config", str(path), "--path", "port", "--dir", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["architecture_differences"]) == 3 and data["architecture_note"] is None
    human = CliRunner().invoke(
        app,
        ["new-model", "o2", "--hf-config", str(path), "--path", "port", "--dir", str(tmp_path)],
        env={"COLUMNS": "400"},
    )
    assert "architecture differences from the llama3 family the keys cannot show" in human.stdout
    assert "post_feedforward_layernorm" in human.stdout


def test_unknown_model_type_says_why_nothing_was_compared(tmp_path):
    llama = {"model_type": "gemma9", **{k: v for k, v in NARROW.items() if v is not None}}
    plan = port_plan(tmp_path, llama)
    assert plan.arch_differences == []
    assert plan.arch_note.startswith("structure not compared:") and "gemma9" in plan.arch_note
    assert plan.arch_note in plan.files["README.md"]


def test_without_transformers_it_degrades_with_a_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    diff = architecture_differences({"model_type": "olmo2", **NARROW}, "llama3")
    assert diff.differences == [] and "pip install 'titan-onboard[hf]'" in diff.note


# ---- what names and shapes cannot show (arch_semantics.py) -----------------------------------
def todos(plan) -> list[str]:
    return [line for line in plan.files["model.py"].splitlines() if line.startswith("# TODO(port): architecture:")]


@pytest.mark.hf
def test_layernorm_with_bias_is_named_although_names_and_shapes_match(tmp_path):
    plan = port_plan(tmp_path, hf_config("stablelm"))  # nn.LayerNorm(bias=True), llama's norm names
    assert plan.family == "llama3"
    [norm] = [d for d in plan.arch_differences if d.startswith("norm type:")]
    assert "(`input_layernorm`, `post_attention_layernorm`) are LayerNorm with bias" in norm
    assert "the llama3 family's are RMSNorm" in norm and "bias mapped" in norm
    assert any("norm type: StableLmDecoderLayer" in t for t in todos(plan))


@pytest.mark.hf
def test_cohere_on_glimmer_norm_type_interleaved_rope_and_use_qk_norm(tmp_path):
    """Cohere: LayerNorm without bias, RoPE on adjacent pairs, and `use_qk_norm`, which glimmer reads
    as its own per-head RMSNorm while Cohere builds a LayerNorm with a weight per head."""
    plan = port_plan(tmp_path, hf_config("cohere", use_qk_norm=True))
    assert plan.family == "glimmer"
    diffs = plan.arch_differences
    assert any(d.startswith("norm type: CohereDecoderLayer's norms (`input_layernorm`) are LayerNorm;") for d in diffs)
    [rope] = [d for d in diffs if d.startswith("RoPE layout:")]
    assert "modeling_cohere.rotate_half([0, 1, 2, 3]) = [-1.0, 0.0, -3.0, 2.0]" in rope and "half-split" in rope
    [key] = [d for d in diffs if d.startswith("config key `use_qk_norm` = True: the glimmer family reads it as")]
    assert "`q_norm` (CohereLayerNorm, weight [4, 16], LayerNorm)" in key
    assert len([t for t in todos(plan) if "RoPE layout" in t or "`use_qk_norm`" in t or "norm type" in t]) == 3


@pytest.mark.hf
def test_padding_idx_from_the_upstream_embedding(tmp_path):
    with_pad = architecture_differences(hf_config("llama", pad_token_id=0), "llama3").differences
    [pad] = with_pad
    assert pad.startswith("embedding padding_idx: LlamaForCausalLM's embedding has padding_idx = 0 (pad_token_id)")
    assert "the llama3 family's tok_embeddings has none" in pad


@pytest.mark.hf
def test_glimmer_config_itself_is_not_told_about_its_own_key(tmp_path):
    from titan_core.models import get_family, resolve_args
    from onboard.workspace import arch_semantics

    cfg = get_family("glimmer").adapter.hf_config(resolve_args("glimmer", "debugmodel"))
    adapter = get_family("glimmer").adapter
    assert cfg["use_qk_norm"] is True
    assert arch_semantics.meaning_lines(cfg, adapter, set(cfg), family="glimmer", upstream_norms=None) == []


def test_keys_alone_say_it_when_transformers_lacks_the_model_type():
    """A remote-code model (no class in transformers): the config's keys still show a layer norm,
    an interleaved RoPE, a pad id and glimmer's `use_qk_norm`."""
    cfg = {"model_type": "mymodel", **{k: v for k, v in NARROW.items() if v is not None},
           "layer_norm_eps": 1e-5, "rope_interleave": True, "pad_token_id": 3, "use_qk_norm": True}  # fmt: skip
    diff = architecture_differences(cfg, "glimmer")
    assert diff.note.startswith("structure not compared:")
    [norm, rope, pad, key] = diff.differences
    assert norm.startswith("norm type: mymodel's norms (by config.json's `layer_norm_eps`) are LayerNorm")
    assert rope.startswith("RoPE layout: config.json sets rope_interleave = True")
    assert pad.startswith("embedding padding_idx: pad_token_id = 3")
    assert key.startswith("config key `use_qk_norm` = True: the glimmer family reads it as") and "holds" not in key
    said = ("layer_norm_eps", "rope_interleave", "pad_token_id", "use_qk_norm")
    plain = {k: v for k, v in cfg.items() if k not in said}
    assert architecture_differences(plain, "glimmer").differences == []


def test_norm_kind_by_what_the_module_computes():
    from torch import nn

    from onboard.workspace.arch_semantics import norm_kind
    from titan_core.models.common.layers import RMSNorm

    class L2(nn.Module):
        def forward(self, x):
            return x / x.norm(dim=-1, keepdim=True)

    with torch.device("meta"):  # as arch_diff builds them
        mods = [nn.LayerNorm(8), nn.LayerNorm(8, bias=False), RMSNorm(8, 1e-6), L2()]
    assert [norm_kind(m, 8) for m in mods] == ["LayerNorm with bias", "LayerNorm", "RMSNorm", "L2Norm"]
