"""[lora]'s module names: the HF names a recipe writes, turned into this model's module names through
the family's adapter (its `to_hf`, the mapping the HF export and the weight stream use), matched by
peft's own rules, so a name means here what it means to peft on the transformers class.

A native module is named by HF when the adapter emits its weight under `<hf module>.weight` as the
tensor itself: a rename. A weight the adapter transposes, slices out of a stack or concatenates
has an HF name but no module of its own here to adapt; a target naming one is refused, not
rerouted. Names are read on meta tensors, so nothing of the model is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.models.common.tied import HF_TIE
from titan_core.runtime.quiet import TORCHAO_IMPORT, quiet_loggers
from titan_core.weights.hf_stream import meta_of

SHOWN = 12
"""Available names a refusal lists."""


@dataclass
class LoraNames:
    """The modules `[lora]` named, as {native module: HF module}."""

    targets: dict[str, str]
    """Modules given adapters."""
    saved: dict[str, str]
    """Modules trained whole (`modules_to_save`)."""


def import_peft() -> None:
    """peft imported once, quietly: it imports torchao, which warns of CUDA kernels a CPU torch lacks."""
    with quiet_loggers(*TORCHAO_IMPORT):
        import peft  # noqa: F401  # lazy: the [hf] extra


def require_peft() -> None:
    """`import_peft`, or ConfigError (bad input) when peft is missing: [lora] needs the [hf] extra."""
    try:
        import_peft()
    except ImportError:
        raise ConfigError("lora.enable needs peft: pip install titan-onboard[hf]") from None


def hf_modules(model: nn.Module, adapter) -> tuple[dict[str, str], set[str]]:
    """({native module: HF module} of every module whose weight the adapter renames, the HF module
    names of every tensor the adapter emits). ConfigError when the adapter cannot name the model's
    tensors (a port whose adapter lacks a layer): LoRA has no names to go by."""
    meta = meta_of(dict(model.state_dict(keep_vars=True)))
    try:
        hf = adapter.to_hf(meta)
    except Exception as e:  # the adapter may be a recipe's own file: anything it raises is a refusal
        raise ConfigError(f"lora: the model's HF adapter cannot name its layers, and [lora] names modules by "
                          f"their HF names: {type(e).__name__}: {e}") from None  # fmt: skip
    first: dict[int, str] = {}
    for h, t in hf.items():
        first.setdefault(id(t), h)  # a tied head is the embedding's second name: the embedding keeps the first
    renamed = {}
    for name, t in meta.items():
        module, _, leaf = name.rpartition(".")
        h = first.get(id(t), "")
        if leaf == "weight" and h.endswith(".weight"):
            renamed[module] = h.removesuffix(".weight")
    return renamed, {h.rpartition(".")[0] for h in hf}


def resolve(model: nn.Module, adapter, target_modules: list[str], modules_to_save: list[str]) -> LoraNames:
    """The native modules `[lora]`'s HF names select (module docstring); ConfigError, one line, for a
    name that matches nothing (the names available listed), one that matches only weights the adapter
    converts, a head the model reads by weight, or a module both adapted and saved."""
    import_peft()
    from peft import LoraConfig  # lazy: the [hf] extra
    from peft.tuners.tuners_utils import check_target_module_exists  # lazy: the [hf] extra

    if model.args.sample_spec().inputs:
        raise ConfigError("lora trains text models for now: this model's loss takes inputs beyond its tokens")
    renamed, every = hf_modules(model, adapter)
    adaptable = {n: h for n, h in renamed.items() if isinstance(model.get_submodule(n), (nn.Linear, nn.Embedding))}
    by_hf = {h: n for n, h in adaptable.items()}
    targets: dict[str, str] = {}
    for name in target_modules:
        rule = LoraConfig(target_modules=[name])
        hits = sorted(h for h in every if check_target_module_exists(rule, h))
        if not hits:
            leaves = sorted({h.rpartition(".")[2] for h in by_hf})
            raise ConfigError(f"lora.target_modules: '{name}' matches no module of this model; its adaptable "
                              f"modules are {', '.join(leaves[:SHOWN])}")  # fmt: skip
        kinds = {h: type(model.get_submodule(n)).__name__ for n, h in renamed.items() if h not in by_hf}
        other = [h for h in hits if h in kinds]
        if other:
            raise ConfigError(f"lora.target_modules: '{name}' matches {other[0]}, a {kinds[other[0]]}: peft adapts "
                              "Linear and Embedding layers; train it whole with lora.modules_to_save")  # fmt: skip
        converted = [h for h in hits if h not in by_hf]
        if converted:
            raise ConfigError(f"lora.target_modules: '{name}' matches {converted[0]}, whose weight the model's "
                              "adapter converts (fused, transposed or stacked): no one layer here to adapt")  # fmt: skip
        targets.update({by_hf[h]: h for h in hits})
    head = HF_TIE.head.removesuffix(".weight")
    if head in targets.values() and model.loss_head is not None:
        raise ConfigError(f"lora.target_modules: {head} is handed to the loss head by its weight, never called, "
                          f"so an adapter on it would do nothing; train it whole: modules_to_save = ['{head}']")  # fmt: skip
    saved = _saved(model, renamed, modules_to_save)
    both = sorted(set(targets) & set(saved))
    if both:
        raise ConfigError(f"lora: {renamed[both[0]]} is both in target_modules and modules_to_save; choose one")
    return LoraNames(targets=targets, saved=saved)


def lora_params(model: nn.Module, names: LoraNames, rank: int) -> int:
    """Parameters [lora] adds and trains: A [r, in] and B [out, r] per adapted layer (an embedding's
    [r, rows] and [cols, r]), and a copy of each saved module. Counted on meta, before peft runs."""
    total = 0
    for n in names.targets:
        rows, cols = model.get_submodule(n).weight.shape
        total += rank * (rows + cols)
    return total + sum(p.numel() for n in names.saved for p in model.get_submodule(n).parameters())


def _saved(model: nn.Module, renamed: dict[str, str], names: list[str]) -> dict[str, str]:
    """{native: HF} of the modules `modules_to_save` names (peft's rule: the name, or a dotted suffix)."""
    out: dict[str, str] = {}
    for name in names:
        hits = {n: h for n, h in renamed.items() if re.match(rf"(^|.*\.){re.escape(name)}$", h)}
        if not hits:
            leaves = sorted({h.rpartition(".")[2] for h in renamed.values()})
            raise ConfigError(f"lora.modules_to_save: '{name}' matches no module of this model that holds a "
                              f"weight; they are {', '.join(leaves[:SHOWN])}")  # fmt: skip
        tied = model.args.tie_embeddings and HF_TIE.embedding.removesuffix(".weight") in hits.values()
        if tied:
            raise ConfigError(f"lora.modules_to_save: '{name}' is the embedding, which this model ties to its "
                              "head; peft on the transformers class trains a copy its head does not share")  # fmt: skip
        out.update(hits)
    return out
