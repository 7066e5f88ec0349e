"""The command-line flags every tiny test run shares, written once.

A tiny run is fp32 on one CPU thread, deterministic, with an lr high enough (and a warmup short
enough) that a few steps move the weights visibly, and no rich table. Used by tests/core/hf_tiny.py,
held_out_data.py, dist/_cases.py and the onboard tests that train a workspace's recipe.
"""

from __future__ import annotations

from pathlib import Path

SEQ_LEN = 32
"""Tokens per row of a tiny run: short enough for seconds per step on a loaded 2-core machine."""


def tiny_run_flags(out: Path | str, *, steps: int, batch_size: int, seq_len: int = SEQ_LEN) -> list[str]:
    """The `--section.key=value` overrides of a tiny run of `steps` steps of `batch_size` rows
    (per data-parallel rank) of `seq_len` tokens, its metrics (and relative checkpoint folders) in `out`."""
    return [
        f"--training.batch_size={batch_size}",
        f"--training.seq_len={seq_len}",
        f"--training.steps={steps}",
        "--training.deterministic",
        "--device.type=cpu",
        "--device.threads=1",
        "--optimizer.lr=3e-3",
        "--lr_scheduler.warmup_steps=1",
        "--metrics.rich=false",
        f"--metrics.output_dir={out}",
    ]
