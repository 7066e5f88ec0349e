"""The export of a [lora] run: its adapter in PEFT's layout (titan_core/lora/export.py), or with `merged`
the model with every adapter merged in, as the HF export writes any model (hf_export.py), from the merged
weight stream (titan_core/lora/stream.py): one gathered weight and its delta at a time, no merged copy
of the model. The run's own `checkpoint.export_hf` and a later export of its checkpoint both come here,
so the two write the same folder."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from titan_core.config.sections import JobConfig
from titan_core.lora.export import export_peft
from titan_core.lora.inject import LoraState, check_mergeable
from titan_core.lora.stream import merged_plan
from titan_core.models.model_builder import model_adapter
from titan_core.training.hf_export import export_hf
from titan_core.weights.export_folder import Replace


def export_lora(model: nn.Module, state: LoraState, cfg: JobConfig, family: str, args, out: str | Path, *,
                merged: bool, tokenizer: list[tuple[Path, str]] = (), replace: Replace = "own") -> Path:  # fmt: skip
    """Write `model`'s adapter (or, `merged`, the merged model with `tokenizer`) into `out`; returns `out`.
    The adapter is for the base `checkpoint.initial_hf` names, which must hold this model's tensors."""
    if not merged:
        return export_peft(model, state, model_adapter(cfg.model), out, base=cfg.checkpoint.initial_hf, replace=replace)
    check_mergeable(model, state.names)
    return export_hf(model, family, args, out, model_cfg=cfg.model, shard_mb=cfg.checkpoint.export_shard_mb,
                     tokenizer=tokenizer, replace=replace, plan=lambda m, adapter: merged_plan(m, state, adapter))  # fmt: skip
