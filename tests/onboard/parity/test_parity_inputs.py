"""What parity reads: the HF config and weights (upstream) and the workspace files (native);
bad input and a broken port are told apart."""

from __future__ import annotations

import json

import pytest
import torch

from onboard.parity.check import check_workspace
from onboard.parity.native import PortError, WorkspaceError, load_adapter, native_args, read_workspace
from onboard.upstream.hf_model import UpstreamError, build_upstream, hf_config_object
from titan_core.config import ConfigError
from titan_core.config.hf_config import read_hf_config

pytestmark = pytest.mark.hf

TINY = {
    "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": 64,
}  # fmt: skip


def test_hf_config_errors_are_bad_input(tmp_path):
    """One reader, one error type: parity reads config.json with titan_core's reader, and the
    upstream side's own refusals are ConfigErrors too (exit 2 at the CLI)."""

    def read():
        return read_hf_config(tmp_path / "config.json", require_model_type=True)

    with pytest.raises(ConfigError, match="not found"):
        read()
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ConfigError, match="malformed JSON"):
        read()
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="model_type"):
        read()
    assert issubclass(UpstreamError, ConfigError)
    with pytest.raises(UpstreamError, match="transformers has no model_type 'nonesuch'"):
        hf_config_object({**TINY, "model_type": "nonesuch"})


def test_seeded_upstream_is_reproducible_and_has_no_constant_tensors():
    a, b = build_upstream(TINY, seed=3), build_upstream(TINY, seed=3)
    assert a.source == "seed=3"
    assert all(torch.equal(a.checkpoint[k], b.checkpoint[k]) for k in a.checkpoint)
    # norms start at 1 in HF's init; parity perturbs them so a swapped or dropped norm shows
    norm = a.checkpoint["model.layers.0.input_layernorm.weight"]
    assert not torch.equal(norm, torch.ones_like(norm))
    other = build_upstream(TINY, seed=4).checkpoint
    assert not torch.equal(other["model.embed_tokens.weight"], a.checkpoint["model.embed_tokens.weight"])


def test_upstream_loads_local_safetensors_weights(tmp_path):
    saved = build_upstream(TINY, seed=7)
    saved.model.save_pretrained(tmp_path / "weights")
    loaded = build_upstream(TINY, weights_dir=tmp_path / "weights", seed=0)
    assert loaded.source == str(tmp_path / "weights")
    assert all(torch.equal(loaded.checkpoint[k], v) for k, v in saved.checkpoint.items())
    with pytest.raises(UpstreamError, match="no \\*.safetensors"):
        build_upstream(TINY, weights_dir=tmp_path)


def _workspace(tmp_path, adapter: str, recipe: str = "") -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "recipe.toml").write_text(f'[model]\nfamily = "llama3"\nhf_config = "config.json"\n{recipe}')
    (tmp_path / "adapter.py").write_text(adapter)


FAMILY_ADAPTER = 'from titan_core.models import get_family\nADAPTER = get_family("llama3").adapter\n'


def test_workspace_reading_errors(tmp_path):
    with pytest.raises(WorkspaceError, match="no recipe.toml"):
        read_workspace(tmp_path)
    _workspace(tmp_path, "def from_hf(sd):\n    return sd\n")
    with pytest.raises(WorkspaceError, match="provides no to_hf, args_from_hf"):
        load_adapter(tmp_path)
    _workspace(tmp_path, "import not_a_module\n")
    with pytest.raises(PortError, match="ModuleNotFoundError"):
        load_adapter(tmp_path)
    _workspace(tmp_path, FAMILY_ADAPTER, "[model.overrides]\nnorm_epsilon = 1e-5\n")
    ws = read_workspace(tmp_path)
    assert ws.hf_config_path == (tmp_path / "config.json").resolve() and ws.path_kind == "native"
    with pytest.raises(WorkspaceError, match="norm_epsilon"):
        native_args(ws, load_adapter(tmp_path), TINY)
    (tmp_path / "recipe.toml").write_text("[model\n")
    with pytest.raises(WorkspaceError, match="malformed TOML"):
        read_workspace(tmp_path)


def test_check_records_port_errors_and_bad_input_in_the_results(tmp_path):
    broken = FAMILY_ADAPTER.replace("ADAPTER = ", "_base = ") + (
        "from_hf = lambda sd: {k: v for k, v in _base.from_hf(sd).items() if False} or 1 / 0\n"
        "to_hf, args_from_hf = _base.to_hf, _base.args_from_hf\n"
    )
    _workspace(tmp_path, broken)
    res = check_workspace(tmp_path)
    assert res["error"]["kind"] == "port" and "adapter.from_hf failed: ZeroDivisionError" in res["error"]["message"]
    on_disk = json.loads((tmp_path / "runs" / "parity" / "results.json").read_text())
    assert on_disk["error"] == res["error"] and "logits_rel_l2" not in on_disk["measurements"]
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "nonesuch"}))
    out = tmp_path / "elsewhere.json"
    res = check_workspace(tmp_path, out=out)
    assert res["error"]["kind"] == "bad_input" and out.is_file()
