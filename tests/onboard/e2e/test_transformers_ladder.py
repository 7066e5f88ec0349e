"""The transformers path end to end: `new-model --path transformers`, then the eager and parity
gates through `onboard next-step`, for four model_types from tiny configs transformers' own
config classes wrote (2 layers, hidden 64), each with the feature that makes it differ from Llama.
`make compat` climbs every causal LM transformers ships (docs/COMPATIBILITY.md), QK-norm (qwen3) and
post-norms (olmo2) among them; the suite keeps these four, one per kind of change to the wrapping.

Parity here checks the wrapping (titan_core's init, loading, loss head and attention kernels
around transformers' class against the same class run plainly), so it must pass out of the box.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app

pytestmark = pytest.mark.hf
runner = CliRunner()

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256, max_position_embeddings=1024)  # fmt: skip


def tiny_config(model_type: str):
    """A tiny transformers config of `model_type`, with what sets it apart switched on."""
    import transformers as tf

    if model_type == "llama":
        return tf.LlamaConfig(**BASE)
    if model_type == "qwen3":  # QK-norm, head_dim not hidden // heads
        return tf.Qwen3Config(**BASE, head_dim=32)
    if model_type == "qwen3_moe":  # 4 experts top-2
        return tf.Qwen3MoeConfig(**BASE, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    if model_type == "olmo2":  # post-norms, full-width QK-norm
        return tf.Olmo2Config(**BASE, pad_token_id=1, bos_token_id=None, eos_token_id=2)
    if model_type == "gemma2":  # soft-caps (scores and logits), sliding/global layers, sandwich norms, tied head
        return tf.Gemma2Config(**BASE, head_dim=16, sliding_window=128)
    if model_type == "granite":  # embedding, residual, attention and logits multipliers
        return tf.GraniteConfig(
            **BASE, embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=2.5
        )
    raise ValueError(model_type)


def onboard(*args):
    return runner.invoke(app, [str(a) for a in args])


MODEL_TYPES = ["llama", "qwen3_moe", "gemma2", "granite"]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_eager_and_parity_pass_on_the_transformers_path(tmp_path, model_type):
    cfg_path = tmp_path / "config.json"
    tiny_config(model_type).to_json_file(cfg_path)
    name = f"tf_{model_type}"
    made = onboard("new-model", name, "--hf-config", cfg_path, "--path", "transformers", "--device", "cpu",
                   "--dir", tmp_path, "--json")  # fmt: skip
    assert made.exit_code == 0, made.stderr
    out = json.loads(made.stdout)
    assert (out["path"], out["family"], out["model_type"]) == ("transformers", "transformers", model_type)
    assert out["unconsumed_keys"] == []
    root = tmp_path / "onboarding" / name
    recipe = (root / "recipe.toml").read_text()
    assert 'family = "transformers"' in recipe
    assert ('attention = "naive"' in recipe) == (model_type == "gemma2")  # only gemma2 caps its scores
    # shorter sequences: the eager rung's criteria do not depend on them
    (root / "recipe.toml").write_text(recipe.replace("seq_len = 128", "seq_len = 64"))

    eager = onboard("next-step", name, "--dir", tmp_path, "--json")
    assert eager.exit_code == 0, eager.stdout + eager.stderr
    e = json.loads(eager.stdout)
    assert (e["rung"], e["status"], e["next_rung"]) == ("eager", "passed", "parity")

    parity = onboard("next-step", name, "--dir", tmp_path, "--json")
    p = json.loads(parity.stdout)
    assert parity.exit_code == 0, json.dumps(p.get("failed"), indent=1) + parity.stderr
    assert (p["rung"], p["status"]) == ("parity", "passed")
    res = json.loads(max((root / "runs" / "parity").glob("attempt-*/results.json")).read_text())
    assert res["path_kind"] == "transformers" and res["error"] is None
    m = res["measurements"]
    # the wrapping adds nothing: identity weights, near-exact logits and loss
    assert m["state_dict_same_keys"] is True and m["state_dict_max_abs_diff"] == 0.0
    assert m["logits_rel_l2"] < 1e-5 and m["loss_abs_diff"] < 1e-5
    assert m["first_divergence_module"] is None
