"""What a training rung read: the workspace's model files and its weights, fingerprinted cheaply."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from onboard.workspace.fsutil import sha256_file
from onboard.rungs import gate_recipe
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.layout import Workspace, fingerprint
from titan_core.config import load_config


def weights(path, seed: int, n: int = 4096) -> None:
    gen = torch.Generator().manual_seed(seed)
    save_file({"a": torch.randn(n, generator=gen), "b": torch.randn(n, 3, generator=gen)}, str(path))


def test_safetensors_fingerprint_sees_other_weights_not_a_rewrite(tmp_path):
    weights(tmp_path / "x.safetensors", seed=0)
    first = fingerprint(tmp_path / "x.safetensors")
    weights(tmp_path / "x.safetensors", seed=0)  # the same tensors written again
    assert fingerprint(tmp_path / "x.safetensors") == first
    weights(tmp_path / "x.safetensors", seed=1)  # same names, shapes and size; other values
    assert fingerprint(tmp_path / "x.safetensors") != first
    weights(tmp_path / "x.safetensors", seed=0, n=4097)  # another shape
    assert fingerprint(tmp_path / "x.safetensors") not in (first, None)
    assert fingerprint(tmp_path / "missing.safetensors") is None
    (tmp_path / "config.json").write_text("{}")
    assert fingerprint(tmp_path / "config.json") == sha256_file(tmp_path / "config.json")


def test_training_rungs_read_adapter_model_config_and_weights(tmp_path):
    (tmp_path / "w").mkdir()
    weights(tmp_path / "w" / "model.safetensors", seed=0)
    plan = plan_workspace("p", tmp_path, preset="llama3/debugmodel", path="port", weights=tmp_path / "w", device="cpu")
    write_workspace(plan)
    ws = Workspace.load(tmp_path, "p")
    ctx = SimpleNamespace(workspace=ws)
    files = gate_recipe.files_read(ctx, load_config(ws.recipe_path))
    recorded = ws.hashes(files)
    assert set(recorded) == {
        "recipe.toml", "config.json", "adapter.py", "model.py", str((tmp_path / "w" / "model.safetensors").resolve()),
    }  # fmt: skip
    assert ws.changed_files(recorded) == []
    weights(tmp_path / "w" / "model.safetensors", seed=1)  # other weights under the same name
    assert ws.changed_files(recorded) == [str((tmp_path / "w" / "model.safetensors").resolve())]
