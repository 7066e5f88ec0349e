"""Weights are checked, not filled in (issue #11, item 6).

transformers initialises a tensor a checkpoint lacks and drops one its class does not use;
the native side then copies HF's state dict, so parity used to pass on a checkpoint missing
most of its tensors. These write the checkpoint folders a user has (a bare model.safetensors,
shards with their index, a broken one) and check what parity records and fails on.
"""

from __future__ import annotations

import json

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

from onboard.parity.check import check_workspace
from onboard.parity.criteria import asserted_criteria
from onboard.parity.results import failure_summary
from onboard.upstream.hf_model import UpstreamError, build_upstream

pytestmark = pytest.mark.hf

TINY = {
    "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": 64,
}  # fmt: skip
WEIGHT_CRITERIA = {"weights_complete", "weights_all_used", "weights_shapes"}


def _tensors(seed: int = 7) -> dict[str, torch.Tensor]:
    """What save_pretrained writes for TINY: 21 tensors (no lm_head.weight duplicate: untied here)."""
    sd = build_upstream(TINY, seed=seed).checkpoint
    return {k: v.detach().clone().contiguous() for k, v in sd.items()}


def _save(folder, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _workspace(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "recipe.toml").write_text('[model]\nfamily = "llama3"\nhf_config = "config.json"\n')
    adapter = 'from titan_core.models import get_family\nADAPTER = get_family("llama3").adapter\n'
    (tmp_path / "adapter.py").write_text(adapter)
    return tmp_path


def _failed(res) -> set[str]:
    return {c.name for c in asserted_criteria() if not c.check(res["measurements"])[0]}


def test_bare_model_safetensors_folder_loads_without_generation_config(tmp_path):
    tensors = _tensors()
    _save(tmp_path / "w", tensors)  # no config.json, no generation_config.json
    up = build_upstream(TINY, weights_dir=tmp_path / "w")
    assert up.counts() == {"weights_missing_keys": 0, "weights_unexpected_keys": 0, "weights_mismatched_keys": 0}
    assert up.loading["files"] == ["model.safetensors"] and up.loading["expected"] == len(tensors) == 21
    assert all(torch.equal(up.checkpoint[k], v) for k, v in tensors.items())


def test_sharded_folder_needs_its_index(tmp_path):
    from safetensors.torch import save_file

    tensors = _tensors()
    keys = sorted(tensors)
    folder = tmp_path / "sharded"
    folder.mkdir()
    shards = {"model-00001-of-00002.safetensors": keys[:10], "model-00002-of-00002.safetensors": keys[10:]}
    for name, ks in shards.items():
        save_file({k: tensors[k] for k in ks}, str(folder / name))
    with pytest.raises(UpstreamError, match="neither model.safetensors nor model.safetensors.index.json"):
        build_upstream(TINY, weights_dir=folder)
    index = {"metadata": {}, "weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    up = build_upstream(TINY, weights_dir=folder)
    assert up.loading["files"] == sorted(shards) and up.counts()["weights_missing_keys"] == 0
    assert all(torch.equal(up.checkpoint[k], v) for k, v in tensors.items())
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UpstreamError, match="names shards that are not in"):
        build_upstream(TINY, weights_dir=folder)


def test_checkpoint_missing_tensors_fails_parity_naming_them(tmp_path):
    tensors = _tensors()
    dropped = sorted(tensors)[:12]
    _save(tmp_path / "w", {k: v for k, v in tensors.items() if k not in dropped})
    res = check_workspace(_workspace(tmp_path), weights_dir=tmp_path / "w")
    assert res["error"] is None
    assert res["measurements"]["weights_missing_keys"] == 12
    assert res["weights_check"]["missing"] == dropped
    # HF filled them in and the native side copied HF: every comparison agrees, yet the gate fails
    assert _failed(res) == {"weights_complete"}
    assert "checkpoint tensors missing (transformers initialised them): 12 of 21" in failure_summary(res)


def test_checkpoint_with_unused_or_misshapen_tensors_fails(tmp_path):
    tensors = _tensors()
    extra = {**tensors, "model.layers.0.mlp.extra_proj.weight": torch.zeros(4, 4)}
    extra["model.norm.weight"] = torch.ones(33)
    _save(tmp_path / "w", extra)
    res = check_workspace(_workspace(tmp_path), weights_dir=tmp_path / "w")
    m = res["measurements"]
    assert (m["weights_unexpected_keys"], m["weights_mismatched_keys"]) == (1, 1)
    assert res["weights_check"]["unexpected"] == ["model.layers.0.mlp.extra_proj.weight"]
    assert res["weights_check"]["mismatched"] == ["model.norm.weight: checkpoint (33,) vs model (32,)"]
    assert {"weights_all_used", "weights_shapes"} <= _failed(res)


def test_keys_the_upstream_class_declares_ignorable_are_not_counted(tmp_path, monkeypatch):
    from transformers import LlamaForCausalLM

    tensors = _tensors()
    _save(tmp_path / "w", {**tensors, "mtp.0.proj.weight": torch.zeros(2, 2)})
    assert build_upstream(TINY, weights_dir=tmp_path / "w").counts()["weights_unexpected_keys"] == 1
    monkeypatch.setattr(LlamaForCausalLM, "_keys_to_ignore_on_load_unexpected", [r"^mtp\."])
    up = build_upstream(TINY, weights_dir=tmp_path / "w")
    assert up.counts()["weights_unexpected_keys"] == 0 and up.loading["ignorable_by_upstream"] == [r"^mtp\."]


def test_seeded_run_records_zero_weight_problems_so_the_criteria_evaluate(tmp_path):
    res = check_workspace(_workspace(tmp_path))
    assert res["weights"] == "seed=0" and res["weights_check"] == {}
    m = res["measurements"]
    assert (m["weights_missing_keys"], m["weights_unexpected_keys"], m["weights_mismatched_keys"]) == (0, 0, 0)
    assert not _failed(res) & WEIGHT_CRITERIA


def test_unreadable_weights_are_bad_input(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "model.safetensors").write_bytes(b"not a safetensors file")
    res = check_workspace(_workspace(tmp_path), weights_dir=tmp_path / "w")
    assert res["error"]["kind"] == "bad_input" and "loading the weights in" in res["error"]["message"]
