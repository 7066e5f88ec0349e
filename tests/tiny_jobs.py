"""Small training jobs more than one test folder runs (tests/ is on the path: its conftest.py)."""

from __future__ import annotations

from titan_core.config.sections import JobConfig


def narrow_config(tmp_path) -> JobConfig:
    """llama3 at 64 wide, 2 layers, batch 4 x 32 tokens, one CPU thread: a step of every kind of op, in milliseconds."""
    cfg = JobConfig()
    cfg.model.overrides = dict(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=256, ffn_hidden_dim=128
    )
    cfg.training.batch_size, cfg.training.seq_len, cfg.training.steps = 4, 32, 10
    cfg.device.type, cfg.device.threads = "cpu", 1
    cfg.metrics.output_dir, cfg.metrics.rich = str(tmp_path), False
    return cfg
