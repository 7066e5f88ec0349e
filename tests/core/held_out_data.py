"""A tiny text corpus and its held-out set, and the one-process config of the validation tests
(tests/core/unit/test_validation.py, test_tensorboard.py, tests/core/dist/test_validation_two_ranks.py)."""

from __future__ import annotations

from pathlib import Path

from tiny_flags import tiny_run_flags
from titan_core.config import load_config

VOCAB = 512
"""The byte tokenizer's ids (256 bytes + specials) fit a vocabulary this size."""
TINY_MODEL = (
    "--model.overrides={n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, ffn_hidden_dim = 128, "
    f"vocab_size = {VOCAB}}}"
)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def paragraphs(first: int, n: int) -> str:
    """n blank-line separated paragraphs of varying length (documents of the text source)."""
    return "\n\n".join(
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(8 + i % 9)) for i in range(first, first + n)
    )


def write_corpus(root: Path) -> Path:
    """root/train.txt and root/val.txt (other paragraphs: 24 documents, 12 rows of 32 + 1 byte tokens and more)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.txt").write_text(paragraphs(0, 60))
    (root / "val.txt").write_text(paragraphs(500, 24))
    return root


def make_cfg(root: Path, *extra: str, steps: int = 5, freq: int = 2, val_steps: int = 3, batch_size: int = 2,
             out: Path | None = None):
    """fp32 on one CPU thread, text from root/train.txt, validation on root/val.txt, metrics in `out`
    (default root/out); plain eager (no process group) unless `extra` says otherwise."""
    return load_config(
        None,
        [
            TINY_MODEL,
            *tiny_run_flags(out or root / "out", steps=steps, batch_size=batch_size),
            "--parallelism.data_parallel=none",
            "--data.source=text",
            f"--data.path={root / 'train.txt'}",
            "--validation.enable",
            f"--validation.path={root / 'val.txt'}",
            f"--validation.freq={freq}",
            f"--validation.steps={val_steps}",
            *extra,
        ],
    )
