"""The upstream model: the HF transformers class for the config's model_type, on CPU in fp32.

It is built from the workspace's config.json with transformers' own config class (never
downloaded), then either initialised from a seed or loaded from local safetensors weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


class UpstreamError(ValueError):
    """The upstream model cannot be built from this input (bad input, exit 2)."""


@dataclass
class Upstream:
    model: nn.Module
    checkpoint: dict[str, torch.Tensor]
    """HF's own state dict: with tied embeddings, lm_head.weight is the embedding tensor itself."""
    source: str
    """'seed=N' or the weights folder."""


def read_hf_config(path: Path) -> dict[str, Any]:
    """titan_core's config.json reader (a model_type required), its ConfigError as UpstreamError."""
    from titan_core.config import ConfigError
    from titan_core.config.hf_config import read_hf_config as read

    try:
        return read(path, require_model_type=True)
    except ConfigError as e:
        raise UpstreamError(str(e)) from None


def _require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UpstreamError("parity needs HF transformers: pip install 'titan-onboard[hf]'") from None


def hf_config_object(cfg: dict[str, Any]):
    """transformers' own config class for cfg['model_type'], filled from the dict."""
    _require_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = cfg["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise UpstreamError(
            f"transformers has no model_type '{model_type}': parity needs the upstream implementation "
            "installed (a transformers version that has it)"
        )
    return CONFIG_MAPPING[model_type].from_dict(cfg)


@torch.no_grad()
def _perturb_constants(model: nn.Module, seed: int) -> None:
    # HF init leaves norm weights at 1 and biases at 0; with those, a swapped q_norm/k_norm,
    # a dropped bias or a (1 + w) norm convention would all look correct.
    gen = torch.Generator().manual_seed(seed + 1)
    for p in model.parameters():
        if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)


def build_upstream(
    cfg: dict[str, Any], *, weights_dir: Path | None = None, seed: int = 0, attn_implementation: str = "eager"
) -> Upstream:
    """The HF causal-LM for `cfg`, fp32 on CPU, in eval mode, seeded or from `weights_dir`."""
    config = hf_config_object(cfg)
    from transformers import AutoModelForCausalLM

    try:
        if weights_dir is not None:
            if not any(Path(weights_dir).glob("*.safetensors")):
                raise UpstreamError(f"no *.safetensors files in weights folder {weights_dir}")
            model = AutoModelForCausalLM.from_pretrained(
                str(weights_dir), config=config, dtype=torch.float32,
                attn_implementation=attn_implementation, local_files_only=True,
            )  # fmt: skip
            source = str(weights_dir)
        else:
            with torch.random.fork_rng(devices=[]):  # HF init draws from the global generator; leave it as found
                torch.manual_seed(seed)
                model = AutoModelForCausalLM.from_config(
                    config, attn_implementation=attn_implementation, dtype=torch.float32
                )
            _perturb_constants(model, seed)
            source = f"seed={seed}"
    except ValueError as e:  # transformers raises ValueError for configs it cannot map to a causal LM
        if isinstance(e, UpstreamError):
            raise
        kind = cfg["model_type"]
        raise UpstreamError(f"transformers cannot build a causal LM for model_type '{kind}': {e}") from None
    model = model.float().eval()
    return Upstream(model=model, checkpoint=model.state_dict(), source=source)
