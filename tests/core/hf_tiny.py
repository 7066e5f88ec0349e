"""A tiny Llama written by transformers' `save_pretrained` in 2 shards, and the recipes that start from it.

Shared by tests/core/unit/test_hf_weights.py and the 2-rank worker (tests/core/dist/_hf_weights_worker.py,
which puts tests/core on its path). Sizes: hidden 64, 2 layers, vocab 512, an MLP of 768 so the fp32
model (1.5 MB) splits into 2 files at max_shard_size 1MB, and into 2 exported shards at export_shard_mb 1.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from tiny_flags import tiny_run_flags
from titan_core.config import load_config
from titan_core.training import generate
from titan_core.training.generate import greedy

SIZES = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
    vocab_size=512, max_position_embeddings=256,
)  # fmt: skip
SEQ_LEN = 32


def write_tiny_llama(folder: Path, *, tied: bool = False, seed: int = 0, **sizes) -> Path:
    """A random tiny LlamaForCausalLM saved in fp32 by save_pretrained in 2 (or more) shards."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**SIZES, **sizes}, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config).float()
    model.save_pretrained(folder, max_shard_size="1MB")
    return folder


def tiny_cfg(ckpt: Path, out: Path, *extra: str, steps: int = 1, batch_size: int = 2):
    """The llama3 family built from the checkpoint's config.json, starting from its weights (fp32, CPU)."""
    return load_config(
        None,
        [
            "--model.family=llama3",
            f"--model.hf_config={ckpt / 'config.json'}",
            f"--checkpoint.initial_hf={ckpt}",
            *tiny_run_flags(out, steps=steps, batch_size=batch_size, seq_len=SEQ_LEN),
            *extra,
        ],
    )


def hf_loss(folder: Path, tokens: torch.Tensor, labels: torch.Tensor, segment_ids: torch.Tensor | None = None) -> float:
    """transformers' LlamaForCausalLM of `folder`: the token-mean cross-entropy of `labels`.

    With `segment_ids` (packed rows of documents, titan_core/data/packing.py) each document is its own
    forward, so its positions start at 0 and it attends only to itself, as titan_core's packed step does."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        if segment_ids is None:
            logits = model(tokens).logits
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100).item()
        total, count = 0.0, 0
        for row, lab, seg in zip(tokens, labels, segment_ids):
            for doc in seg.unique():
                mine = seg == doc
                logits = model(row[mine][None]).logits[0].float()
                total += F.cross_entropy(logits, lab[mine], ignore_index=-100, reduction="sum").item()
                count += int((lab[mine] != -100).sum())
    return total / count


PROMPT = [[5, 17, 42, 99, 3, 250]]


def titan_greedy(model, n: int = 10, prompt=PROMPT) -> list[int]:
    """`n` greedy tokens of a titan_core model after `prompt` (its forward gives logits)."""
    return greedy(model, prompt[0], n)


def hf_greedy(folder: Path, n: int = 10, prompt=PROMPT) -> list[int]:
    """`n` greedy tokens of the export in `folder`, through AutoModelForCausalLM.generate."""
    return generate.hf_greedy(folder, prompt[0], n)
