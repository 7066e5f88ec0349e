"""Architecture differences the config keys cannot show: new-model --path port compares the
upstream HF decoder layer (built on meta from config.json) with the closest family's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
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
    [norms, qk] = plan.arch_differences
    assert norms.startswith("norm placement: Olmo2DecoderLayer has post-attention")
    assert "post-MLP (on the MLP output) `post_feedforward_layernorm`" in norms
    assert "the llama3 Block has pre-attention `attention_norm`, pre-MLP `ffn_norm`" in norms
    assert qk.startswith("QK-norm: Olmo2DecoderLayer has QK-norm over the full width") and "[64]" in qk
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
    [attn, mlp] = diff.differences
    assert attn.startswith("attention projections: Phi3DecoderLayer has `self_attn.o_proj`, `self_attn.qkv_proj`")
    assert mlp.startswith("MLP projections: Phi3DecoderLayer has `mlp.down_proj`, `mlp.gate_up_proj`;")


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
    assert len(data["architecture_differences"]) == 2 and data["architecture_note"] is None
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
