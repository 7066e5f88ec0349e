"""What the [lora] tests of tests/core/unit share: the tiny Llama recipe with adapters on q_proj, v_proj
and down_proj in one eager process, its built model, and the one-line refusal every bad input must give."""

from __future__ import annotations

import pytest
import torch

from tiny_flags import tiny_run_flags
from titan_core.config import ConfigError, load_config
from titan_core.models.model_builder import build_model_from_config

TINY = "--model.overrides={n_layers=2, dim=64, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_hidden_dim=128}"
LORA = ["--parallelism.data_parallel=none", "--lora.enable", "--lora.target_modules=q_proj,v_proj,down_proj"]


def lora_cfg(tmp_path, *extra, steps=1):
    """The recipe, its metrics under tmp_path/out, `extra` flags last."""
    return load_config(None, [TINY, *tiny_run_flags(tmp_path / "out", steps=steps, batch_size=2), *LORA, *extra])


def sample_tokens(vocab=256):
    return torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(3))


def built(tmp_path, *extra):
    """(the recipe, its model materialised and initialised from seed 0) in one process."""
    cfg = lora_cfg(tmp_path, *extra)
    _, _, model = build_model_from_config(cfg.model)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return cfg, model


def refusal(fn) -> str:
    """The ConfigError `fn` must raise: one line."""
    with pytest.raises(ConfigError) as e:
        fn()
    text = str(e.value)
    assert "\n" not in text
    return text
