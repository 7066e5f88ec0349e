"""Checkpoints: bit-exact resume, atomic saves, save schedule, and HF export."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from titan_core.training import checkpoint as ckpt_mod
from titan_core.training.checkpoint import Checkpointer
from titan_core.training.hf_export import export_hf
from titan_core.config import ConfigError, JobConfig
from titan_core.data import build_data_loader
from titan_core.models import build_meta, get_family, resolve_args

TINY = dict(n_layers=1, dim=64, n_heads=4, n_kv_heads=2, ffn_hidden_dim=128, vocab_size=256)


def _args(**extra):
    return resolve_args("llama3", "debugmodel", {**TINY, **extra})


def _parts(init_seed: int, args=None):
    """Model, AdamW, a warmup-then-decay LambdaLR and a synthetic loader, all fresh."""
    args = args or _args()
    model = build_meta("llama3", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=init_seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / 3, 3 / (s + 1)))
    cfg = JobConfig()
    cfg.training.batch_size, cfg.training.seq_len = 2, 16
    return dict(model=model, optimizer=opt, lr_scheduler=sched, data_loader=build_data_loader(cfg, vocab_size=256))


def _train(parts, steps: int) -> list[tuple[float, float, float]]:
    """(loss, lr, a draw from the global RNG) per step: the draw shows RNG state is restored."""
    out = []
    for _ in range(steps):
        batch = next(parts["data_loader"])
        loss, _ = parts["model"].loss(batch.tokens, batch.labels)
        loss.backward()
        lr = parts["optimizer"].param_groups[0]["lr"]
        parts["optimizer"].step()
        parts["optimizer"].zero_grad()
        parts["lr_scheduler"].step()
        out.append((loss.item(), lr, torch.rand(()).item()))
    return out


def test_resume_continues_bit_for_bit(tmp_path):
    torch.manual_seed(1234)
    uninterrupted = _train(_parts(init_seed=0), 6)

    torch.manual_seed(1234)
    ck = Checkpointer(tmp_path, interval=3, enable=True)
    parts = _parts(init_seed=0)
    first = _train(parts, 3)
    assert ck.maybe_save(3, **parts) == tmp_path / "step-3"

    torch.manual_seed(999)  # a fresh process would have some other RNG state
    fresh = _parts(init_seed=7)  # other weights: only the checkpoint can make them right
    assert ck.load_latest(**fresh) == 3
    assert fresh["data_loader"].step == 3
    rest = _train(fresh, 3)
    assert first == uninterrupted[:3]
    assert [r[0] for r in rest] == [u[0] for u in uninterrupted[3:]]  # losses of steps 4-6, exact
    assert rest == uninterrupted[3:]  # and the lr schedule and RNG draws


def test_interrupted_save_is_never_loaded(tmp_path, monkeypatch):
    ck = Checkpointer(tmp_path, interval=2, enable=True)
    parts = _parts(init_seed=0)
    _train(parts, 2)
    ck.save(2, **parts)
    _train(parts, 2)

    def crash(tmp, final):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(ckpt_mod, "_publish", crash)
    with pytest.raises(KeyboardInterrupt):
        ck.save(4, **parts)
    # Everything was written, only the rename is missing: the guard is the rename itself.
    assert (tmp_path / ".step-4.partial" / ".metadata").is_file()
    assert not (tmp_path / "step-4").exists()
    assert ck.latest_step() == 2
    fresh = _parts(init_seed=1)
    assert ck.load_latest(**fresh) == 2 and fresh["data_loader"].step == 2

    monkeypatch.undo()
    ck.save(4, **parts)  # a later save of the same step clears the debris
    assert ck.latest_step() == 4 and not (tmp_path / ".step-4.partial").exists()


def test_save_schedule_and_disabled_checkpointer(tmp_path):
    parts = _parts(init_seed=0)
    ck = Checkpointer(tmp_path / "on", interval=2, enable=True)
    for step in range(1, 6):
        ck.maybe_save(step, **parts, last=step == 5)
    assert sorted(p.name for p in (tmp_path / "on").iterdir()) == ["step-2", "step-4", "step-5"]

    off = Checkpointer(tmp_path / "on", interval=1, enable=False)
    assert off.maybe_save(6, **parts, last=True) is None
    assert off.load_latest(**parts) is None  # never resumes from a folder it was told to ignore
    assert not (tmp_path / "on" / "step-6").exists()


def test_from_config_puts_relative_folder_under_output_dir(tmp_path):
    cfg = JobConfig()
    cfg.metrics.output_dir = str(tmp_path / "run")
    cfg.checkpoint.folder, cfg.checkpoint.interval, cfg.checkpoint.enable = "ck", 5, True
    ck = Checkpointer.from_config(cfg)
    assert (ck.folder, ck.interval, ck.enable) == (tmp_path / "run" / "ck", 5, True)


@pytest.mark.hf
@pytest.mark.parametrize("tied", [False, True])
def test_export_hf_round_trips_and_loads_in_transformers(tmp_path, tied):
    transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")
    from safetensors.torch import load_file

    args = _args(tie_embeddings=tied)
    model = _parts(init_seed=3, args=args)["model"]
    out = export_hf(model, "llama3", args, tmp_path / "hf")

    native = model.state_dict()
    stored = load_file(str(out / "model.safetensors"))
    assert ("lm_head.weight" in stored) is not tied  # a tied head is stored once, as the embedding
    back = get_family("llama3").adapter.from_hf(stored, tie_embeddings=tied)
    assert sorted(back) == sorted(native)
    assert all(torch.equal(back[k], native[k]) for k in native)

    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied and config["vocab_size"] == 256
    hf, info = transformers.LlamaForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    hf_sd = hf.state_dict()
    assert torch.equal(hf_sd["model.embed_tokens.weight"], native["tok_embeddings.weight"])
    assert torch.equal(hf_sd["lm_head.weight"], model.output_weight)
    assert torch.equal(hf_sd["model.layers.0.mlp.down_proj.weight"], native["layers.0.feed_forward.w2.weight"])
    # The exported config describes the same architecture (RoPE scaling included).
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), atol=1e-4, rtol=1e-5)


def test_export_hf_without_safetensors_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ConfigError, match=r"pip install titan-onboard\[hf\]"):
        export_hf(_parts(init_seed=0)["model"], "llama3", _args(), tmp_path / "hf")
