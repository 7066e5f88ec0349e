"""The upstream model: the HF transformers class for the config's model_type, on CPU in fp32.

It is built from the workspace's config.json with transformers' own config class (never
downloaded), then either initialised from a seed or loaded from local safetensors weights.
Loaded weights are checked, not filled in: transformers initialises a tensor the checkpoint
lacks and drops one the class does not use, so both are recorded (with the counts the
parity checklist requires to be 0); patterns the upstream class itself declares ignorable
(`_keys_to_ignore_on_load_missing` / `_unexpected`, tied weights) are not counted. A folder
with `model.safetensors`, or sharded files with `model.safetensors.index.json`, is enough:
no config.json or generation_config.json is read from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from titan_core.config import ConfigError
from titan_core.models.transformers.hf_classes import causal_lm_parts

from onboard.upstream.init_check import TensorStats, init_stats


class UpstreamError(ConfigError):
    """The upstream model cannot be built from this input (bad input, exit 2): a ConfigError, the
    one error type of bad model input, so the config reader's own errors need no translation."""


@dataclass
class Upstream:
    model: nn.Module
    checkpoint: dict[str, torch.Tensor]
    """HF's own state dict: with tied embeddings, lm_head.weight is the embedding tensor itself."""
    source: str
    """'seed=N' or the weights folder."""
    loading: dict[str, Any] = field(default_factory=dict)
    """What loading the weights found: files, and the checkpoint tensors the upstream class
    expects but did not get (`missing`), got but does not use (`unexpected`) or got with
    another shape (`mismatched`), after the class's own ignorable patterns; all empty when seeded."""
    init: dict[str, TensorStats] | None = None
    """Each parameter's init as transformers' `_init_weights` left it (init_check.TensorStats), taken
    before `perturb_constants`; None when the model came from a weights folder (`seeded_init`)."""

    def counts(self) -> dict[str, int]:
        """The measurements: how many tensors are missing, unused, mis-shaped (0 for a seeded init)."""
        return {
            "weights_missing_keys": len(self.loading.get("missing", [])),
            "weights_unexpected_keys": len(self.loading.get("unexpected", [])),
            "weights_mismatched_keys": len(self.loading.get("mismatched", [])),
        }


def _require_transformers() -> None:
    try:
        import transformers  # noqa: F401  # lazy: the [hf] extra; this probe turns its absence into UpstreamError
    except ImportError:
        raise UpstreamError("parity needs HF transformers: pip install 'titan-onboard[hf]'") from None


def hf_config_object(cfg: dict[str, Any]):
    """transformers' own config class for cfg['model_type'], filled from the dict."""
    _require_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # lazy: the [hf] extra, checked above

    model_type = cfg["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise UpstreamError(
            f"transformers has no model_type '{model_type}': parity needs the upstream implementation "
            "installed (a transformers version that has it)"
        )
    return CONFIG_MAPPING[model_type].from_dict(cfg)


def causal_lm(config, **kwargs) -> nn.Module:
    """transformers' causal LM of `config` built from it (`from_config`): for a composite config
    (text beside vision or audio) its text model, as the transformers path trains it
    (titan_core's hf_classes.causal_lm_parts)."""
    cls, model_config = causal_lm_parts(config)
    return cls._from_config(model_config, **kwargs)


@torch.no_grad()
def perturb_constants(model: nn.Module, seed: int) -> None:
    # HF init leaves norm weights at 1 and biases at 0; with those, a swapped q_norm/k_norm,
    # a dropped bias or a (1 + w) norm convention would all look correct.
    gen = torch.Generator().manual_seed(seed + 1)
    for p in model.parameters():
        if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)
    # an integer table into the module's own weight rows that init leaves constant (DeepSeek-V4's
    # hash routing, token id -> experts, zeros until a checkpoint fills it) sends every token to the
    # same rows: each entry gets distinct random rows, as a checkpoint's table spreads them
    for module in model.modules():
        rows = getattr(module, "weight", None)
        if not (isinstance(rows, torch.Tensor) and rows.dim() == 2):
            continue
        for name, table in module.named_buffers(recurse=False):
            if name in module._non_persistent_buffers_set:  # not in the checkpoint the native model loads
                continue
            if _constant_index_table(table, rows.shape[0]):
                picks = torch.rand(table.shape[0], rows.shape[0], generator=gen).argsort(dim=1)[:, : table.shape[1]]
                table.copy_(picks.to(table.dtype))


def _constant_index_table(t: torch.Tensor, n_rows: int) -> bool:
    """A 2-D integer tensor of one value throughout, whose rows could each pick that many of `n_rows`."""
    integer = not t.is_floating_point() and t.dtype != torch.bool
    return integer and t.dim() == 2 and t.numel() > 1 and t.shape[1] <= n_rows and bool((t == t.flatten()[0]).all())


def _seeded(config, seed: int, attn_implementation: str) -> nn.Module:
    """transformers' causal LM of `config` as its own init leaves it under `seed`, fp32."""
    with torch.random.fork_rng(devices=[]):  # HF init draws from the global generator; leave it as found
        torch.manual_seed(seed)
        return causal_lm(config, attn_implementation=attn_implementation, dtype=torch.float32)


def _own_init(model: nn.Module, keep_below: int) -> dict[str, TensorStats]:
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return init_stats(model.state_dict(), names, keep_below=keep_below)


def seeded_init(cfg: dict[str, Any], *, seed: int = 0, keep_below: int = 0) -> dict[str, TensorStats]:
    """Upstream's own init of `cfg` under `seed`, summarised per parameter (the model built for it
    is dropped): what init parity compares with when parity itself runs on loaded weights."""
    return _own_init(_seeded(hf_config_object(cfg), seed, "eager"), keep_below)


def build_upstream(
    cfg: dict[str, Any],
    *,
    weights_dir: Path | None = None,
    seed: int = 0,
    attn_implementation: str = "eager",
    init_keep_below: int = 0,
) -> Upstream:
    """The HF causal-LM for `cfg`, fp32 on CPU, in eval mode, seeded or from `weights_dir`.

    Seeded, `init` summarises its own init before the constants are perturbed (keeping the
    values of tensors under `init_keep_below` elements, for init_check's pools)."""
    config = hf_config_object(cfg)
    try:
        loading: dict[str, Any] = {}
        init = None
        if weights_dir is not None:
            model, loading = _load_weights(Path(weights_dir), config, attn_implementation)
            source = str(weights_dir)
        else:
            model = _seeded(config, seed, attn_implementation)
            init = _own_init(model, init_keep_below)
            perturb_constants(model, seed)
            source = f"seed={seed}"
    except ValueError as e:  # transformers raises ValueError for configs it cannot map to a causal LM
        if isinstance(e, UpstreamError):
            raise
        kind = cfg["model_type"]
        raise UpstreamError(f"transformers cannot build a causal LM for model_type '{kind}': {e}") from None
    model = model.float().eval()
    return Upstream(model=model, checkpoint=model.state_dict(), source=source, loading=loading, init=init)


def weight_files(weights_dir: Path, *, stem: str = "model") -> list[Path]:
    """The safetensors files of a weights folder: <stem>.safetensors, or the shards its index names
    (stem: transformers' `model`, diffusers' `diffusion_pytorch_model`).

    UpstreamError (bad input) for a folder that is neither, or whose index names absent shards.
    """
    if not weights_dir.is_dir():
        raise UpstreamError(f"weights folder {weights_dir} does not exist")
    index = weights_dir / f"{stem}.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UpstreamError(f"{index}: not a safetensors index (no weight_map): {e}") from None
        absent = [s for s in shards if not (weights_dir / s).is_file()]
        if absent:
            raise UpstreamError(f"{index} names shards that are not in {weights_dir}: {', '.join(absent)}")
        return [weights_dir / s for s in shards]
    if (weights_dir / f"{stem}.safetensors").is_file():
        return [weights_dir / f"{stem}.safetensors"]
    found = sorted(p.name for p in weights_dir.glob("*.safetensors"))
    if found:
        raise UpstreamError(
            f"weights folder {weights_dir} holds {', '.join(found[:4])}{' ...' if len(found) > 4 else ''} but neither "
            f"{stem}.safetensors nor {stem}.safetensors.index.json: a sharded checkpoint needs its index"
        )
    raise UpstreamError(f"no *.safetensors files in weights folder {weights_dir}")


def _load_weights(weights_dir: Path, config, attn_implementation: str):
    """from_pretrained on the folder, with the loading report kept (nothing silently filled in)."""
    from safetensors import SafetensorError  # lazy: the [hf] extra, needed only to load a weights folder
    from transformers import AutoModelForCausalLM, GenerationConfig  # lazy: the [hf] extra, checked by the caller

    files = weight_files(weights_dir)
    try:
        # a generation config given means none is read from the folder (parity never generates);
        # mismatched shapes are reported with the rest instead of raised one by one
        model, info = AutoModelForCausalLM.from_pretrained(
            str(weights_dir), config=config, dtype=torch.float32, attn_implementation=attn_implementation,
            local_files_only=True, use_safetensors=True, generation_config=GenerationConfig(),
            ignore_mismatched_sizes=True, output_loading_info=True,
        )  # fmt: skip
    except (OSError, RuntimeError, TypeError, KeyError, SafetensorError) as e:  # an unreadable or foreign checkpoint
        raise UpstreamError(f"loading the weights in {weights_dir} failed: {type(e).__name__}: {e}") from None
    mismatched = [
        f"{m[0]}: checkpoint {tuple(m[1])} vs model {tuple(m[2])}"
        if isinstance(m, (tuple, list)) and len(m) == 3
        else str(m)
        for m in info.get("mismatched_keys") or []
    ]
    loading = {
        "files": [p.name for p in files],
        "expected": len(set(model.state_dict()) - set(getattr(model, "all_tied_weights_keys", None) or {})),
        "missing": sorted(info.get("missing_keys") or []),
        "unexpected": sorted(info.get("unexpected_keys") or []),
        "mismatched": sorted(mismatched),
        "ignorable_by_upstream": sorted(
            set(getattr(model, "_keys_to_ignore_on_load_missing", None) or [])
            | set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
        ),
    }
    return model, loading
