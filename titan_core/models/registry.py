"""Model families: name -> (model class, flavors, HF adapter, args type), and building a model on meta.

A family says what kind of model it builds through its args type (`ModelFamily.kind`,
models/common/kind.py): callers ask that instead of checking which family it is."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable, Mapping

import torch
from torch import nn

from titan_core.config.loader import ConfigError, did_you_mean
from titan_core.models.common.args import ModelArgs, TransformerArgs
from titan_core.models.common.kind import ModelKind
from titan_core.models.common.mapping_errors import ArchitectureError
from titan_core.models.common.hf_adapter import HFAdapter
from titan_core.models.common.validate import validate_args

FAMILY_NAMES = ("llama3", "qwen3", "qwen3_moe", "glimmer")
"""The causal-LM families of the shared decoder: each claims the HF model_types its adapter reads, and a port
starts from one of them."""
NATIVE_FAMILIES = (*FAMILY_NAMES, "flux")
"""Every family titan_core runs natively, of any kind (each says which: `ModelFamily.kind`); flux reads
a diffusers config, whose class names its model_type."""
TRANSFORMERS_FAMILY = "transformers"
"""The transformers path (models/transformers): HF's own class for any model_type; chosen by name, claims none."""


@dataclass(frozen=True)
class ModelFamily:
    name: str
    """The family's name (`model.family`) and its folder under titan_core/models/."""
    model_cls: Callable[[ModelArgs], nn.Module]
    """The model class, built from the family's args."""
    flavors: Mapping[str, ModelArgs]
    """Named sizes (`model.flavor`): `debugmodel` is the CPU test shape."""
    adapter: HFAdapter
    """Upstream names and config both ways (the family's upstream: `kind.upstream`)."""
    args_type: type[ModelArgs] = TransformerArgs
    """The args its models are built from; a family of another kind than the shared decoder's has its own."""

    @property
    def kind(self) -> ModelKind:
        """What kind of model the family builds (its args type's)."""
        return self.args_type.kind


def get_family(name: str) -> ModelFamily:
    known = [*NATIVE_FAMILIES, TRANSFORMERS_FAMILY]
    if name not in known:
        raise ConfigError(f"unknown model family '{name}'{did_you_mean(name, known)}")
    module = importlib.import_module(f"titan_core.models.{name}")
    return module.FAMILY


def family_for_hf_model_type(model_type: str) -> ModelFamily | None:
    for name in NATIVE_FAMILIES:
        fam = get_family(name)
        if model_type in fam.adapter.hf_model_types:
            return fam
    return None


def resolve_args(family: str, flavor: str, overrides: dict | None = None) -> ModelArgs:
    fam = get_family(family)
    if flavor not in fam.flavors:
        raise ConfigError(f"unknown flavor '{flavor}' of {family}{did_you_mean(flavor, sorted(fam.flavors))}")
    return apply_model_overrides(fam.flavors[flavor], overrides)


def apply_model_overrides(args: ModelArgs, overrides: dict | None) -> ModelArgs:
    """`args` with the `model.overrides` fields of their own type replaced (an `extra` table merges
    into args.extra, key by key, and a table inside it field by field), checked against the
    structural rules (models/common/validate.py).

    ConfigError naming an unknown field, a size the args type derives (naming the fields it follows
    from), or an override that breaks a rule; an ArchitectureError (an AdapterError) when args that
    came in already break one (an adapter that skipped the checks). Every recipe's args pass here,
    so a hand edit of the recipe is refused before a model is built.
    """
    overrides = overrides or {}
    valid = set(type(args).__dataclass_fields__)
    for key in overrides:
        if key in args.derived:
            raise ConfigError(
                f"model override '{key}': a {args.kind.name} model's {key} is {args.derived[key]}; override those"
            )
        if key not in valid:
            raise ConfigError(f"unknown model override '{key}'{did_you_mean(key, sorted(valid))}")
    if "extra" in overrides:
        if not isinstance(overrides["extra"], dict):
            raise ConfigError(f"model override 'extra' must be a table of port fields, got {overrides['extra']!r}")
        # a table inside extra (a port's own config) merges field by field too
        merged = {
            k: {**args.extra[k], **v} if isinstance(v, dict) and isinstance(args.extra.get(k), dict) else v
            for k, v in overrides["extra"].items()
        }
        overrides = {**overrides, "extra": {**args.extra, **merged}}
    if overrides:
        args = replace(args, **overrides)
    try:
        validate_args(args, names={k: f"model.overrides.{k}" for k in overrides})
    except ArchitectureError as e:
        if set(e.fields) & set(overrides):
            raise ConfigError(str(e)) from None
        raise
    return args


def build_meta(family: str, args: ModelArgs) -> nn.Module:
    """The model on the meta device: no memory, ready for swaps and parallelisation."""
    with torch.device("meta"):
        return get_family(family).model_cls(args)
