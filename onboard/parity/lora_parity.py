"""The recipe's [lora] proved by parity: titan_core's adapters (titan_core.lora) on the native model
against peft's own on the upstream class, CPU fp32, the same base weights and the same adapter weights.

check.py calls `measure` after its passes, when the native model and upstream hold the same weights.
Everything runs on deep copies of both (the passes' models are never touched) and under
`torch.random.fork_rng` with generators of its own (no RNG state of the run consumed). Four numbers:

- `lora_zero_b_max_abs`: the native model with the adapters as `apply_lora` makes them (peft's
  B = 0) against the native model without them: exactly 0.0, or the adapters change the base.
- `lora_peft_rel_l2`: every B (and every saved module's trainable copy) drawn from a seeded
  generator; the native logits against upstream's class given the same adapter weights by peft
  (`get_peft_model`, then `set_peft_model_state_dict` of the PEFT export's own tensors,
  titan_core.lora.export.adapter_tensors): the logits' bound, as the same model computed twice.
- `lora_grads_only_adapters`: after a backward of the native loss, every parameter holding a
  gradient is an adapter or a saved module's copy, and every one of those holds one.
- `lora_merge_rel_l2`: `merged_copy` (peft's merge) against the unmerged model; not applicable
  where the adapters cannot be merged (an adapter on an embedding tied to the head).

`lora` and `lora_merge` say what was proved ("none..." where nothing was: the criteria read them as
not applicable). A [lora] the model cannot take (a name that matches nothing) is titan_core's
ConfigError, which check.py records as bad input; `refuse_early` raises it before the passes run.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from titan_core.config import ConfigError
from titan_core.lora.export import adapter_tensors
from titan_core.lora.inject import apply_lora, check_mergeable, merged_copy
from titan_core.lora.names import require_peft, resolve
from titan_core.measure.numerics import max_abs, rel_l2

from onboard.parity.compare import cap
from onboard.parity.native import call_port

NO_LORA = "none: the recipe has no [lora] enabled"
SEED = 2000
"""Added to parity's seed for the inputs and the adapters' draws here: none the passes use."""
B_STD = 1.0
"""Each B is drawn as N(0, (B_STD x its base weight's std)^2) (0.02 where that std is 0): the adapters
then move the logits far past the bounds (the record's `adapters_change_logits_rel_l2`), so an adapter
wired wrongly on either side cannot hide under them."""
SAVED_STD = 0.1
"""A saved module's trainable copy moves by N(0, (SAVED_STD x its std)^2), so it differs from the original."""


def disabled(cfg: Any) -> dict[str, Any]:
    """The measurements of a recipe without [lora] enabled ("none": its criteria do not apply); {} with it."""
    return {} if cfg is not None and cfg.enable else {"lora": NO_LORA, "lora_merge": NO_LORA}


def refuse_diffusion(cfg: Any) -> None:
    """ConfigError for [lora] on a diffusers model: titan_core's [lora] trains text models only."""
    if cfg is not None and cfg.enable:
        raise ConfigError("lora trains text models for now: this model's loss takes inputs beyond its tokens")


def refuse_early(cfg: Any, native: nn.Module, adapter: Any) -> None:
    """ConfigError now, before the passes, for a [lora] this model cannot take: no peft, or a name
    that selects nothing (titan_core.lora.names.resolve, the check apply_lora makes first)."""
    if cfg is None or not cfg.enable:
        return
    require_peft()
    resolve(native, adapter, list(cfg.target_modules), list(cfg.modules_to_save))


def measure(cfg: Any, native: nn.Module, hf: nn.Module, adapter: Any, tokens: torch.Tensor, labels: torch.Tensor,
            *, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """(measurements, record) of the recipe's [lora] (`cfg`, its section) on copies of `native` and
    `hf` (module docstring). Without [lora] enabled: `lora` and `lora_merge` say none, nothing else."""
    if cfg is None or not cfg.enable:
        return disabled(cfg), {}
    require_peft()
    with torch.random.fork_rng(devices=[]):
        return _measure(cfg, native, hf, adapter, tokens, labels, seed)


def _measure(cfg, native, hf, adapter, tokens, labels, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    ours = copy.deepcopy(native).eval()
    ours.zero_grad(set_to_none=True)
    state = apply_lora(ours, cfg, adapter, seed=seed + SEED)
    ours.eval()  # peft's new layers start in training mode: a dropout would draw
    names = state.names
    saved = f", {len(names.saved)} saved whole" if names.saved else ""
    m: dict[str, Any] = {"lora": f"rank {cfg.rank} on {len(names.targets)} modules{saved} "
                                 f"({', '.join(map(str, cfg.target_modules))})"}  # fmt: skip
    record: dict[str, Any] = {"targets": cap(sorted(names.targets.values())), "saved": sorted(names.saved.values()),
                              "rank": cfg.rank, "alpha": cfg.alpha, "problems": []}  # fmt: skip
    with torch.no_grad():
        plain = call_port(native, "native forward", tokens)
        m["lora_zero_b_max_abs"] = max_abs(call_port(ours, "native forward with [lora]", tokens), plain)
        _draw(ours, seed)
        adapted = call_port(ours, "native forward with [lora]", tokens)
    record["adapters_change_logits_rel_l2"] = rel_l2(adapted, plain)  # how far the comparisons below can fail
    m["lora_peft_rel_l2"] = _against_peft(ours, state, hf, tokens, adapted, record)
    m["lora_grads_only_adapters"] = _grads(ours, tokens, labels, record)
    ours.zero_grad(set_to_none=True)  # the merged copy need not carry them
    try:
        check_mergeable(ours, names)
    except ConfigError as e:  # a [lora] that trains but cannot be merged: its merge has nothing to prove
        m["lora_merge"] = f"none: {e}"
    else:
        merged = merged_copy(state)
        with torch.no_grad():
            m["lora_merge_rel_l2"] = rel_l2(call_port(merged, "merged native forward", tokens), adapted)
        m["lora_merge"] = "merged_copy against the unmerged model"
    if m["lora_zero_b_max_abs"] != 0.0:
        record["problems"].append(f"with B = 0 the adapters change the logits by {m['lora_zero_b_max_abs']!r}")
    return m, record


def _draw(model: nn.Module, seed: int) -> None:
    """Every lora_B (and every saved module's trainable copy) given values from a seeded generator."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: the [hf] extra
    from peft.utils.other import ModulesToSaveWrapper  # lazy: the [hf] extra

    gen = torch.Generator().manual_seed(seed + SEED)
    for _, module in sorted(model.named_modules(), key=lambda nm: nm[0]):
        if isinstance(module, BaseTunerLayer):
            std = float(module.get_base_layer().weight.detach().float().std()) or 0.02
            for attr in ("lora_B", "lora_embedding_B"):  # a Linear's B, an Embedding's
                holder = getattr(module, attr, None)
                for p in holder.parameters() if isinstance(holder, nn.Module) else ():
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (B_STD * std))
        elif isinstance(module, ModulesToSaveWrapper):
            for p in module.modules_to_save.parameters():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (SAVED_STD * float(p.float().std())))


def _against_peft(ours: nn.Module, state, hf: nn.Module, tokens: torch.Tensor, adapted: torch.Tensor,
                  record: dict[str, Any]) -> float:  # fmt: skip
    """rel L2 of `adapted` (the native logits with the drawn adapters) against upstream's class with
    the same adapters put on it by peft from the PEFT export's tensors."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict  # lazy: the [hf] extra

    cfg = state.cfg
    config = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
        target_modules=sorted(state.names.targets.values()), modules_to_save=sorted(state.names.saved.values()) or None,
    )  # fmt: skip
    upstream = copy.deepcopy(hf)
    upstream.zero_grad(set_to_none=True)
    theirs = get_peft_model(upstream, config).eval()
    loaded = set_peft_model_state_dict(theirs, adapter_tensors(ours, state))
    unmatched = [*loaded.unexpected_keys, *(k for k in loaded.missing_keys if ".lora_" in k or "modules_to_save" in k)]
    record["peft_keys_unmatched"] = cap(sorted(unmatched))
    if unmatched:
        record["problems"].append(f"peft on {type(hf).__name__} found no place for the adapter tensors, or "
                                  f"no tensor for its own adapters: {', '.join(sorted(unmatched)[:4])}")  # fmt: skip
    with torch.no_grad():
        return rel_l2(adapted, theirs(input_ids=tokens, use_cache=False).logits)


def _grads(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, record: dict[str, Any]) -> bool:
    """After a backward of the native loss: is every parameter with a gradient an adapter or a saved
    copy, and does every one of those have one? `grads_outside_adapters` and `adapters_without_grads`
    in the record name the exceptions."""
    own = _adapter_parameters(model)
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        loss, _ = call_port(model.loss, "native loss with [lora]", tokens, labels)
        loss.backward()
    params = list(model.named_parameters())
    outside = sorted(n for n, p in params if p.grad is not None and id(p) not in own)
    without = sorted(n for n, p in params if id(p) in own and p.grad is None)
    record.update(adapter_parameters=len(own), grads_outside_adapters=cap(outside),
                  adapters_without_grads=cap(without))  # fmt: skip
    if outside:
        record["problems"].append(f"parameters outside the adapters hold gradients: {', '.join(outside[:4])}")
    if without:
        record["problems"].append(f"adapters without a gradient: {', '.join(without[:4])}")
    return bool(own) and not outside and not without


def _adapter_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters peft added: each LoRA layer's adapter weights (peft's `adapter_layer_names`)
    and each saved module's trainable copy."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: the [hf] extra
    from peft.utils.other import ModulesToSaveWrapper  # lazy: the [hf] extra

    out: set[int] = set()
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            for attr in module.adapter_layer_names:
                holder = getattr(module, attr, None)
                if isinstance(holder, nn.Module):
                    out.update(id(p) for p in holder.parameters())
        elif isinstance(module, ModulesToSaveWrapper):
            out.update(id(p) for p in module.modules_to_save.parameters())
    return out
