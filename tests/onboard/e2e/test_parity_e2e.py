"""Parity end to end: tiny HF configs -> scaffolded workspace -> upstream vs native.

Five model types must pass out of the box; six porting bugs an agent really makes must
fail, each with the right module named as the first divergence. These call the same
`check_workspace` the workspace's test_parity.py calls (in process, to stay fast); the
subprocess path through the rung is tested in test_parity_rung.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_parity_support import add_adapter_methods, edit_file, new_workspace, set_model_overrides, tiny_config

from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria, threshold

pytestmark = pytest.mark.hf

UPSTREAM_CLASS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def failed(res: dict) -> set[str]:
    return {c.name for c in asserted_criteria() if not c.check(res["measurements"])[0]}


@pytest.mark.parametrize("model_type", sorted(UPSTREAM_CLASS))
def test_native_family_passes_out_of_the_box(tmp_path, model_type):
    root = new_workspace(tmp_path, f"tiny_{model_type}", tiny_config(model_type))
    res = check_workspace(root)
    assert res["error"] is None
    assert res["upstream_class"] == UPSTREAM_CLASS[model_type]
    assert res["path_kind"] == "native"
    m = res["measurements"]
    assert failed(res) == set(), json.dumps(m, indent=1)
    assert m["state_dict_same_keys"] is True and m["state_dict_max_abs_diff"] == 0.0
    assert m["seq_len"] >= 512 and m["batch"] == 2
    assert m["first_divergence_module"] is None
    # the comparison really looked inside: both layers' attention and MLP/MoE were paired
    compared = {row["native"] for row in res["localisation"]["table"]}
    mlp = "moe" if model_type == "qwen3_moe" else "feed_forward"
    assert {"tok_embeddings", "layers.0.attention", f"layers.0.{mlp}", "layers.1.attention", "norm"} <= compared
    assert "output" in compared
    on_disk = json.loads((root / "runs" / "parity" / "results.json").read_text())
    assert on_disk["measurements"] == m


def assert_diverges_at(res: dict, module: str, also_failing: set[str] = frozenset()) -> None:
    assert res["error"] is None, res["error"]
    m = res["measurements"]
    assert {"logits_rel_l2"} | set(also_failing) <= failed(res), json.dumps(m, indent=1)
    assert m["first_divergence_module"] == module, json.dumps(res["localisation"]["divergent"], indent=1)
    assert m["first_divergence_rel_l2"] > threshold("logits_rel_l2")
    # everything that ran before the named module (its own sub-modules aside) agreed:
    # the localisation names the first divergence, not just a divergent module
    rows = res["localisation"]["table"]
    before = rows[: next(i for i, r in enumerate(rows) if r["native"] == module)]
    before = [r for r in before if not r["native"].startswith(module + ".")]
    assert before or module == "tok_embeddings"
    assert all(r["rel_l2"] is None or r["rel_l2"] <= threshold("logits_rel_l2") for r in before)


def test_wrong_rope_theta_diverges_in_layer0_attention(tmp_path):
    cfg = tiny_config("llama", rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    root = new_workspace(tmp_path, "bad_theta", cfg)
    add_adapter_methods(
        root,
        '''
def args_from_hf(self, cfg):
    """Port bug: written for transformers 4 configs, where rope_theta was a top-level key."""
    import dataclasses
    args, used = super().args_from_hf(cfg)
    return dataclasses.replace(args, rope_theta=float(cfg.get("rope_theta", 10000.0))), used
''',
    )
    res = check_workspace(root)
    assert_diverges_at(res, "layers.0.attention", {"grad_max_rel_l2"})
    assert res["measurements"]["state_dict_max_abs_diff"] == 0.0  # weights fine: only the forward differs
    assert "inside layers.0.attention" in res["localisation"]["first"]["why"]


def test_missing_qk_norm_diverges_in_layer0_attention(tmp_path):
    root = new_workspace(tmp_path, "bad_qknorm", tiny_config("qwen3"), path="port")
    # port bug: model.py's Attention built without the config's QK-norm
    edit_file(root, "model.py", "qk_norm=args.qk_norm, ", "")
    res = check_workspace(root)
    assert res["path_kind"] == "port"
    assert_diverges_at(res, "layers.0.attention", {"state_dict_same_keys"})
    assert "model.layers.0.self_attn.q_norm.weight" in res["state_dict"]["missing_after_round_trip"]


def test_transposed_weight_in_adapter_diverges_at_layer0_wq(tmp_path):
    root = new_workspace(tmp_path, "bad_transpose", tiny_config("llama"))
    add_adapter_methods(
        root,
        '''
def from_hf(self, sd, **kw):
    """Port bug: assumed HF stores q_proj as [in, out] (square here, so no shape error)."""
    out = super().from_hf(sd, **kw)
    return {k: (v.t() if k.endswith("attention.wq.weight") else v) for k, v in out.items()}
''',
    )
    res = check_workspace(root)
    assert_diverges_at(res, "layers.0.attention.wq", {"state_dict_round_trip", "grad_max_rel_l2"})
    assert res["measurements"]["first_divergence_upstream"] == "model.layers.0.self_attn.q_proj"
    assert res["state_dict"]["worst_key"].endswith("self_attn.q_proj.weight")


def test_wrong_norm_epsilon_diverges_at_layer0_attention_norm(tmp_path):
    root = new_workspace(tmp_path, "bad_eps", tiny_config("llama", rms_norm_eps=1e-6))
    set_model_overrides(root, norm_eps=1e-5)  # port bug: "the usual" epsilon instead of the config's
    res = check_workspace(root)
    assert_diverges_at(res, "layers.0.attention_norm")
    assert res["measurements"]["first_divergence_upstream"] == "model.layers.0.input_layernorm"


def test_dropped_tie_word_embeddings_diverges_at_output(tmp_path):
    root = new_workspace(tmp_path, "bad_tie", tiny_config("llama", tie_word_embeddings=True))
    add_adapter_methods(
        root,
        '''
def args_from_hf(self, cfg):
    """Port bug: tie_word_embeddings never read, so the output head gets its own weight."""
    import dataclasses
    args, used = super().args_from_hf(cfg)
    return dataclasses.replace(args, tie_embeddings=False), used - {"tie_word_embeddings"}
''',
    )
    res = check_workspace(root)
    assert_diverges_at(res, "output", {"state_dict_round_trip", "grad_max_rel_l2"})
    assert res["state_dict"]["native_not_loaded"] == ["output.weight"]


def test_sliding_window_off_by_one_diverges_in_layer0_attention(tmp_path):
    root = new_workspace(tmp_path, "bad_window", tiny_config("mistral"))
    add_adapter_methods(
        root,
        '''
def extra_args_from_hf(self, cfg, take):
    """Port bug: counted the window without the query token."""
    kw = super().extra_args_from_hf(cfg, take)
    return {**kw, "sliding_window": kw["sliding_window"] + 1}
''',
    )
    res = check_workspace(root)
    assert_diverges_at(res, "layers.0.attention")


def test_weights_folder_is_the_upstream_and_the_rendered_test_uses_it(tmp_path):
    from transformers import AutoModelForCausalLM

    from onboard.workspace.scaffold import plan_workspace, write_workspace

    cfg = tiny_config("qwen2", tie_word_embeddings=True)
    cfg.to_json_file(tmp_path / "config.json")
    with torch.random.fork_rng():
        torch.manual_seed(123)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "weights")
    plan = plan_workspace("w", tmp_path, hf_config=tmp_path / "config.json", weights=tmp_path / "weights")
    root = write_workspace(plan)
    assert str(tmp_path / "weights") in (root / "test_parity.py").read_text()
    # the rendered test, run by pytest as a person would (in process here, to stay fast)
    code = pytest.main([str(root / "test_parity.py"), "-q", "-p", "no:cacheprovider", f"--rootdir={root}"])
    assert code == 0
    res = json.loads((root / "runs" / "parity" / "results.json").read_text())
    assert res["weights"] == str(tmp_path / "weights") and res["error"] is None
    assert failed(res) == set()
    seeded = check_workspace(root, out=tmp_path / "seeded.json")  # no weights: a seeded init instead
    assert seeded["weights"] == "seed=0"
    assert seeded["measurements"]["upstream_loss"] != res["measurements"]["upstream_loss"]
