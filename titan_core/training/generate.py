"""Greedy generation, the check that an HF export is the trained model: the same prompt, the
same tokens, through titan_core's model and through transformers' reload of the export.

Used by the tests (tests/core/hf_tiny.py) and by the product's demo of a trained export.
transformers is imported only inside `hf_greedy` (titan_core runs without it).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from titan_core.config.dtypes import DTYPES
from titan_core.config.sections import JobConfig
from titan_core.models.model_builder import build_model_from_config, materialize_on_cpu
from titan_core.training.checkpoint import load_model_weights


def greedy(model: nn.Module, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens of a titan_core model after `prompt` (its forward gives logits)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids[0, len(prompt) :].tolist()


def hf_greedy(folder: str | Path, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens of the HF model folder `folder` (an export), through
    AutoModelForCausalLM.generate in fp32."""
    import transformers  # lazy: the [hf] extra

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.tensor([prompt])
    # min_new_tokens: an EOS must not end one side's tokens early and hide a difference after it
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def model_from_checkpoint(cfg: JobConfig, path: str | Path) -> nn.Module:
    """The recipe's model holding the weights of the DCP checkpoint `path` (a `step-N` folder),
    in one process, in fp32 and eval mode: a bf16 run's weights upcast, so that it computes
    as transformers' fp32 reload of the export does."""
    _, _, model = build_model_from_config(cfg.model)
    model = materialize_on_cpu(model, cfg.training.seed, DTYPES[cfg.training.dtype])
    load_model_weights(path, model)
    return model.float().eval()
