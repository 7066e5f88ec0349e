"""The eager rung's full-size probe (onboard/rungs/full_model.py), wired to a workspace: the full
model of config.json built on meta, its counts, its names against the upstream class, and the
--weights checkpoint checked from its safetensors headers alone.

Checkpoints: real ones written from a debug-size model, and a header-only fake of the real
Qwen3-8B (every tensor declared, the data region a hole: 16 GiB declared, nothing written).
"""

from __future__ import annotations

import json

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

from onboard.ladder.gates import evaluate, load_checklist
from onboard.rungs import full_model
from onboard.rungs import gate_recipe
from onboard.ladder.contract import RungContext
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.sizing.twin.setup import apply_twin
from onboard.workspace.layout import Workspace
from real_size_configs import PUBLISHED
from test_checkpoint_headers import hf_state_dict, meta_specs, write_fake, write_real
from test_hub_checkpoints import TINY_MIXTRAL, config_dict, mixtral_hub_checkpoint, write_hub

pytest.importorskip("transformers", reason="the probe compares with the upstream class")
pytestmark = pytest.mark.hf


def probe(tmp_path, name: str, **plan_kw):
    plan = plan_workspace(name, tmp_path, device="cpu", **plan_kw)
    if plan_kw.get("hf_config"):
        apply_twin(plan, mode="on")
    write_workspace(plan)
    ws = Workspace.load(tmp_path, name)
    lines: list[str] = []
    ctx = RungContext(workspace=ws, attempt_dir=tmp_path / name / "attempt", evidence={}, log=lines.append)
    m, details = full_model.probe(ctx, gate_recipe.job_config(ctx))
    criteria = {c["name"]: c["ok"] for c in evaluate(load_checklist("eager"), m, {}, {})}
    return m, details["full_model"], criteria, lines


def test_small_real_checkpoint_passes_and_a_wrong_dtype_is_named(tmp_path):
    weights = write_real(tmp_path / "w", hf_state_dict("qwen3"), shards=2)
    m, details, ok, lines = probe(tmp_path, "small", preset="qwen3/debugmodel", weights=weights)
    assert m["full_model_built_on_meta"] and m["full_model_key_mismatches"] == 0
    assert m["full_model_keys_reference"].startswith("the adapter's round trip (no twin: parity compares")
    assert m["full_model_checkpoint_problems"] == 0 and m["full_model_runs_as"] == "the full model"
    assert m["full_model_checkpoint_bytes_read"] < m["full_model_checkpoint_bytes_declared"]  # headers only
    assert ok["full_model_built_on_meta"] and ok["full_model_keys_match_upstream"]
    assert ok["full_model_checkpoint_matches"]
    assert "checkpoint:" in lines[-1]
    fp32 = write_real(tmp_path / "w32", hf_state_dict("qwen3", dtype=torch.float32), torch_dtype="bfloat16")
    m, details, ok, _ = probe(tmp_path, "small32", preset="qwen3/debugmodel", weights=fp32)
    assert m["full_model_checkpoint_problems"] == m["full_model_checkpoint_wrong_dtype"] == m["full_model_tensors"]
    assert details["checkpoint"]["wrong_dtype"][0]["dtype"] == "float32" and not ok["full_model_checkpoint_matches"]


def test_header_only_fake_of_qwen3_8b_behind_its_twin(tmp_path):
    specs = meta_specs("qwen3", "8B")
    dropped = "model.layers.7.mlp.down_proj.weight"
    del specs[dropped]
    weights = write_fake(tmp_path / "w8b", specs, shards=4)
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["Qwen3-8B"][2]))
    m, details, ok, _ = probe(tmp_path, "q8", hf_config=tmp_path / "config.json", weights=weights)
    assert m["full_model_runs_as"].startswith("twin of the full model")  # the rungs train the twin ...
    assert m["full_model_params_total"] == 8_190_735_360  # ... and the probe checks the full model
    assert m["full_model_key_mismatches"] == 0 and m["full_model_tensors"] == 399
    assert m["full_model_keys_reference"] == "the upstream Qwen3ForCausalLM built on meta"
    assert m["full_model_checkpoint_problems"] == 1 and not ok["full_model_checkpoint_matches"]
    assert details["checkpoint"]["missing"] == [
        {"native": "layers.7.feed_forward.w2.weight", "hf": [dropped], "shape": [4096, 12288]}
    ]
    assert m["full_model_checkpoint_bytes_declared"] > 15 * 2**30 > 2**20 > m["full_model_checkpoint_bytes_read"]


def test_a_full_model_that_does_not_build_fails_its_criterion(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["Qwen3-8B"][2]))
    plan = plan_workspace("broken", tmp_path, hf_config=tmp_path / "config.json", device="cpu")
    apply_twin(plan, mode="on")
    root = write_workspace(plan)
    full = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**full, "hidden_act": "gelu"}))  # the twin still builds
    ws = Workspace.load(tmp_path, "broken")
    ctx = RungContext(workspace=ws, attempt_dir=root / "a", evidence={}, log=lambda _: None)
    m, details = full_model.probe(ctx, gate_recipe.job_config(ctx))
    assert m["full_model_built_on_meta"] is False and "hidden_act 'gelu'" in details["full_model"]["error"]
    criteria = {c["name"]: c["ok"] for c in evaluate(load_checklist("eager"), m, {}, {})}
    assert criteria["full_model_built_on_meta"] is False and criteria["full_model_keys_match_upstream"] is False


def test_transformers_path_reads_a_hub_layout_checkpoint_and_counts_top_k(tmp_path):
    """Mixtral on the transformers path: per-expert Hub tensors, an old inv_freq, no torch_dtype in config.json."""
    c = TINY_MIXTRAL
    sd = mixtral_hub_checkpoint(c)
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    weights = write_hub(tmp_path / "w", sd, c)
    (tmp_path / "config.json").write_text(json.dumps(config_dict(c)))
    m, details, ok, _ = probe(tmp_path, "mix", hf_config=tmp_path / "config.json", weights=weights, path="transformers")
    assert m["full_model_checkpoint_problems"] == 0 and ok["full_model_checkpoint_matches"], details
    assert details["checkpoint"]["dtype_source"].startswith("the checkpoint's headers")
    d, i, e, k = c.hidden_size, c.intermediate_size, c.num_local_experts, c.num_experts_per_tok
    total = sum(v.numel() for name, v in sd.items() if not name.endswith("inv_freq"))
    assert m["full_model_params_total"] == total
    assert m["full_model_params_active"] == total - c.num_hidden_layers * (e - k) * 3 * d * i
