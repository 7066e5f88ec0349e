"""The transformers path's export and checkpoint checks: `--checkpoint.export_hf` writes a folder
`AutoModelForCausalLM.from_pretrained` loads to the trained model's logits (the parity gate's
thresholds), its config.json the workspace's with every field, architectures, and the recipe's
overrides; a `--weights` checkpoint missing a tensor or holding an extra one is named by both
checks that read it (the eager rung's header check and parity's upstream loading)."""

from __future__ import annotations

import json

import pytest
import torch

from onboard.ladder.gates import load_checklist
from titan_core.config import load_config
from titan_core.measure.numerics import max_abs, rel_l2

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytestmark = pytest.mark.hf

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256, max_position_embeddings=256)  # fmt: skip
_PARITY = load_checklist("parity")
LOGITS_REL_L2 = _PARITY.criterion("logits_rel_l2").threshold
LOGITS_MAX_ABS = _PARITY.criterion("logits_max_abs").threshold


def _train_and_export(tmp_path, config, *extra):
    from titan_core.training.trainer import Trainer

    cfg_path = tmp_path / "config.json"
    config.to_json_file(cfg_path)
    cfg = load_config(None, [
        "--model.family=transformers", f"--model.hf_config={cfg_path}", "--training.batch_size=2",
        "--training.seq_len=32", "--training.steps=2", "--device.type=cpu", "--optimizer.lr=3e-3",
        "--metrics.rich=false", f"--metrics.output_dir={tmp_path / 'run'}",
        f"--checkpoint.export_hf={tmp_path / 'export'}", *extra,
    ])  # fmt: skip
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    return json.loads(cfg_path.read_text()), trainer.model, tmp_path / "export"


def _same_logits(model, folder):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = hf(tokens).logits, model.eval()(tokens)
    assert rel_l2(got, want) <= LOGITS_REL_L2 and max_abs(got, want) <= LOGITS_MAX_ABS
    return hf


def test_export_loads_with_from_pretrained_and_gives_the_trained_logits(tmp_path):
    workspace_cfg, model, out = _train_and_export(tmp_path, transformers.LlamaConfig(**BASE))
    exported = json.loads((out / "config.json").read_text())
    assert exported["model_type"] == "llama" and exported["architectures"] == ["LlamaForCausalLM"]
    dropped = {"dtype", "torch_dtype"}  # the export states the dtype of its own tensors
    assert {k: v for k, v in exported.items() if k not in dropped} | {"architectures": None} == {
        k: v for k, v in workspace_cfg.items() if k not in dropped
    } | {"architectures": None}
    assert exported["dtype"] == "float32"
    with safetensors_torch.safe_open(out / "model.safetensors", "pt") as f:
        names = set(f.keys())
    hf = _same_logits(model, out)
    assert names == set(hf.state_dict())  # transformers' own names, every one


def test_export_says_the_overridden_depth(tmp_path):
    # gemma2: a tied head (stored once) and layer_types, which must follow the new depth
    config = transformers.Gemma2Config(**BASE, head_dim=16, sliding_window=8)
    _, model, out = _train_and_export(tmp_path, config, "--model.overrides={n_layers = 1}", "--kernels.attention=naive")
    exported = json.loads((out / "config.json").read_text())
    assert exported["num_hidden_layers"] == 1 and exported["layer_types"] == ["sliding_attention"]
    hf = _same_logits(model, out)
    assert len(hf.model.layers) == 1


@pytest.fixture()
def broken_checkpoints(tmp_path):
    """(config dict, folder missing one tensor, folder with one extra tensor) of a tiny llama."""
    config = transformers.LlamaConfig(**BASE)
    sd = {k: v.contiguous() for k, v in transformers.LlamaForCausalLM(config).state_dict().items()}
    missing, extra = tmp_path / "missing", tmp_path / "extra"
    for folder, tensors in (
        (missing, {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}),
        (extra, {**sd, "model.layers.0.mlp.gate.weight": torch.zeros(4, 64)}),
    ):
        folder.mkdir()
        safetensors_torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return config.to_dict(), missing, extra


def test_weights_header_check_names_the_missing_and_the_extra_tensor(broken_checkpoints):
    from onboard.upstream.weights_headers import check_checkpoint_headers
    from titan_core.models.registry import build_meta
    from titan_core.models.transformers import ADAPTER

    cfg, missing, extra = broken_checkpoints
    args, _ = ADAPTER.args_from_hf(cfg)
    meta = build_meta("transformers", args)
    report = check_checkpoint_headers(missing, meta, ADAPTER)
    assert [m["native"] for m in report.missing] == ["model.layers.1.mlp.up_proj.weight"] and not report.extra
    report = check_checkpoint_headers(extra, meta, ADAPTER)
    assert [e["native"] for e in report.extra] == ["model.layers.0.mlp.gate.weight"] and not report.missing


def test_parity_loading_names_the_missing_and_the_extra_tensor(broken_checkpoints):
    from onboard.upstream.hf_model import build_upstream

    cfg, missing, extra = broken_checkpoints
    up = build_upstream(cfg, weights_dir=missing)
    assert up.loading["missing"] == ["model.layers.1.mlp.up_proj.weight"] and up.counts()["weights_missing_keys"] == 1
    up = build_upstream(cfg, weights_dir=extra)
    assert up.loading["unexpected"] == ["model.layers.0.mlp.gate.weight"]
    assert up.counts()["weights_unexpected_keys"] == 1
