"""Parity of what it did not see before (issue 32, item 6): the MoE load-balancing term against
upstream's, and the fresh native init against upstream's own init (onboard/upstream/init_check.py)."""

from __future__ import annotations

import json

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch
from torch import nn

from onboard.parity.check import check_workspace
from onboard.parity.criteria import load_criteria, params, threshold
from onboard.upstream.init_check import compare_init, init_stats
from onboard.parity.results import failure_summary
from onboard.workspace.scaffold import plan_workspace, write_workspace

TINY_MOE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=128, vocab_size=256, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                router_aux_loss_coef=0.02)  # fmt: skip


def judged(native: dict, upstream: dict) -> dict:
    keep = int(params()["init_min_elements"])
    stats = [init_stats(sd, None, keep_below=keep) for sd in (native, upstream)]
    return compare_init(*stats, params())


def normal(shape, std, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * std


# ---- init: the statistics ------------------------------------------------------------------
def test_init_constants_exact_random_tensors_by_mean_and_std():
    up = {"ln.weight": torch.ones(64), "ln.bias": torch.zeros(64), "wo.weight": normal((128, 64), 0.02, 0),
          "wq.weight": normal((128, 64), 0.02, 1)}  # fmt: skip
    same = {"ln.weight": torch.ones(64), "ln.bias": torch.zeros(64), "wo.weight": normal((128, 64), 0.02, 2),
            "wq.weight": normal((128, 64), 0.02, 3)}  # fmt: skip
    assert judged(same, up)["init_tensors_differing"] == 0
    # the old port template: a LayerNorm bias filled by the norm rule; an output projection scaled by depth
    old = {**same, "ln.bias": torch.ones(64), "wo.weight": normal((128, 64), 0.02 / 2, 2)}
    report = judged(old, up)
    assert (report["init_tensors_compared"], report["init_tensors_differing"]) == (4, 2)
    why = {d["tensor"]: d["why"] for d in report["differing"]}
    assert why["ln.bias"] == "upstream initialises it to 0.0 throughout; native: 1.0 throughout"
    assert why["wo.weight"].startswith("std 0.009") and "(rel 0.50" in why["wo.weight"]


def test_small_tensors_pool_over_layers_or_are_listed_unjudged():
    up = {f"layers.{i}.gate.weight": normal((8, 64), 0.02, i) for i in range(8)}  # 512 each, 4096 pooled
    nat_ok = {k: normal((8, 64), 0.02, 10 + i) for i, k in enumerate(up)}
    nat_bad = {k: normal((8, 64), 0.05, 10 + i) for i, k in enumerate(up)}
    assert judged(nat_ok, up)["init_tensors_differing"] == 0
    bad = judged(nat_bad, up)
    assert bad["init_tensors_compared"] == 1 and bad["differing"][0]["tensor"] == "layers.*.gate.weight"
    one = "layers.0.gate.weight"
    few = judged({one: nat_bad[one]}, {one: up[one]})
    assert (few["init_tensors_compared"], few["not_judged"]) == (0, ["layers.0.gate.weight (512 elements)"])


# ---- the port template -------------------------------------------------------------------------
def port(tmp_path, name: str, **cfg):
    import transformers as tf

    path = tmp_path / f"{name}.json"
    tf.Qwen3MoeConfig(**{**TINY_MOE, **cfg}).to_json_file(path)
    return write_workspace(plan_workspace(name, tmp_path, hf_config=path, path="port", device="cpu"))


def load_port_model(root):
    from titan_core.models.model_builder import load_module_file

    return load_module_file(root / "model.py")


@pytest.mark.hf
def test_template_init_gives_a_layernorm_bias_0(tmp_path):
    """A porter swapping the template's RMSNorm for nn.LayerNorm keeps upstream's init: bias 0, weight 1."""
    from titan_core.models.common.args import TransformerArgs

    root = port(tmp_path, "ln")
    text = (root / "model.py").read_text().replace("self.ffn_norm = RMSNorm(args.dim, args.norm_eps)",
                                                   "self.ffn_norm = nn.LayerNorm(args.dim, args.norm_eps)")  # fmt: skip
    (root / "model.py").write_text(text)
    args = TransformerArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16, vocab_size=64, ffn_hidden_dim=64)
    model = load_port_model(root).build_model(args)
    model.init_weights(seed=0)
    norm = model.layers["0"].ffn_norm
    assert isinstance(norm, nn.LayerNorm)
    assert torch.equal(norm.bias, torch.zeros(32)) and torch.equal(norm.weight, torch.ones(32))


# ---- parity: the aux term and the init, measured ----------------------------------------------
def failed(res) -> dict[str, float]:
    return {c.name: v for c in load_criteria() for ok, v in [c.check(res["measurements"])] if not ok}


@pytest.mark.hf
def test_parity_compares_the_aux_term_and_the_init_on_a_moe_port(tmp_path):
    root = port(tmp_path, "on", output_router_logits=True)
    res = check_workspace(root, batch=1, seq_len=64)  # short: the seq_len criterion alone fails
    m = res["measurements"]
    assert res["error"] is None and set(failed(res)) == {"seq_len", "pytest_passed"}, json.dumps(m, indent=1)
    assert m["upstream_aux_loss"] > 0.02  # 0.02 x a loss near top_k = 2
    assert m["aux_loss_abs_diff"] <= threshold("aux_loss_abs_diff")
    assert m["init_tensors_compared"] >= 15 and m["init_tensors_differing"] == 0
    assert res["init"]["not_judged"] == [f"model.layers.{i}.mlp.gate.weight (256 elements)" for i in (0, 1)]


@pytest.mark.hf
def test_parity_fails_an_aux_term_upstream_does_not_add(tmp_path):
    """output_router_logits false: upstream adds nothing, so a port that adds the term (here forced by
    a recipe override, as a port reading router_aux_loss_coef alone would) fails the aux criterion."""
    root = port(tmp_path, "off")
    recipe = root / "recipe.toml"
    recipe.write_text(recipe.read_text() + "\n[model.overrides]\naux_loss_coef = 0.02\n")
    res = check_workspace(root, batch=1, seq_len=64)
    m = res["measurements"]
    assert m["upstream_aux_loss"] == 0.0 and m["native_aux_loss"] > 0.02
    assert "aux_loss" in failed(res) and m["aux_loss_abs_diff"] > 1e3 * threshold("aux_loss_abs_diff")
    summary = failure_summary(res)
    assert "MoE load-balancing term: native 0.0" in summary and "output_router_logits off" in summary


@pytest.mark.hf
def test_transformers_path_tied_head_starts_where_upstream_embedding_does(tmp_path):
    """Youtu's embedding init draws twice the std of its head's: transformers initialises both
    untied and then ties the head to the embedding, so the transformers path must too (it tied
    first, and the head's init won: the std half of upstream's)."""
    from onboard.compat.climb import scaffold

    ws, _ = scaffold("youtu", tmp_path)
    res = check_workspace(ws.root, batch=1, seq_len=64)
    assert res["error"] is None and res["init"]["differing"] == [], res["init"]
    assert res["measurements"]["init_tensors_compared"] >= 20
