"""Tiny shapes and helpers shared by the compile tests (kept small: the CI machine has 2 cores).

Every family's debugmodel shrunk to dim 64, 2 layers, vocab 256; qwen3_moe keeps 4
experts, top 2, with the capture-friendly `moe.dense` experts; glimmer keeps its
local/global and RoPE-skip pattern within 2 layers.
"""

from __future__ import annotations

import torch

from titan_core.config import load_config
from titan_core.config.sections import Optimizer
from titan_core.data.base import Batch
from titan_core.models import FAMILY_NAMES, build_meta, resolve_args
from titan_core.training.optim import build_optimizer
from titan_core.parallel.local import local_tensor as local  # noqa: F401  (the compile tests' name for it)

COMMON = {
    "n_layers": 2,
    "dim": 64,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 16,
    "ffn_hidden_dim": 128,
    "vocab_size": 256,
}
EXTRA = {
    "llama3": {},
    "qwen3": {},
    "qwen3_moe": {"n_experts": 4, "top_k": 2, "moe_hidden_dim": 64},
    "glimmer": {"sliding_window": 8, "global_every": 2, "rope_skip_every": 2},
}
FAMILIES = [f for f in FAMILY_NAMES if f in EXTRA]


def model_overrides(family: str, **more) -> dict:
    return {**COMMON, **EXTRA[family], **more}


def _toml_table(d: dict) -> str:
    return "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}"


def swaps(family: str) -> list[str]:
    return ["--kernels.moe=dense"] if family == "qwen3_moe" else []


def tiny_cfg(family: str, out, *extra: str, steps: int = 3, batch_size: int = 4, seq_len: int = 32, **model_more):
    return load_config(
        None,
        [
            f"--model.family={family}",
            f"--model.overrides={_toml_table(model_overrides(family, **model_more))}",
            f"--training.batch_size={batch_size}",
            f"--training.seq_len={seq_len}",
            f"--training.steps={steps}",
            "--training.deterministic",
            "--device.type=cpu",
            "--optimizer.lr=3e-3",
            "--lr_scheduler.warmup_steps=1",
            "--metrics.rich=false",
            f"--metrics.output_dir={out}",
            *swaps(family),
            *extra,
        ],
    )


def build(family: str, *, dense_moe: bool = True, **model_more):
    """A materialised tiny model and its AdamW (plain tensors, no parallelism)."""
    from titan_core.models.common.swaps import apply_swaps

    args = resolve_args(family, "debugmodel", model_overrides(family, **model_more))
    model = build_meta(family, args)
    if family == "qwen3_moe" and dense_moe:
        import titan_core.compile  # noqa: F401  (registers moe.dense)

        apply_swaps(model, ["moe.dense"])
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model, build_optimizer(model, Optimizer(lr=3e-3))


def batches(n: int, *, vocab: int = 256, batch: int = 4, seq: int = 32, seed: int = 1) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [
        Batch(torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
        for _ in range(n)
    ]


def same_params(a, b) -> bool:
    return all(torch.equal(local(p), local(q)) for p, q in zip(a.parameters(), b.parameters()))
