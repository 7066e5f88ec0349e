"""Model families: name -> (model class, flavors, HF adapter), and building a model on meta."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from titan_core.config.loader import ConfigError, _closest
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.hf_adapter import HFAdapter

FAMILY_NAMES = ("llama3", "qwen3", "qwen3_moe", "glimmer")


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_cls: Callable[[TransformerArgs], nn.Module]
    flavors: dict[str, TransformerArgs]
    adapter: HFAdapter


def get_family(name: str) -> ModelFamily:
    if name not in FAMILY_NAMES:
        raise ConfigError(f"unknown model family '{name}'{_closest(name, list(FAMILY_NAMES))}")
    module = importlib.import_module(f"titan_core.models.{name}")
    return module.FAMILY


def family_for_hf_model_type(model_type: str) -> ModelFamily | None:
    for name in FAMILY_NAMES:
        fam = get_family(name)
        if model_type in fam.adapter.hf_model_types:
            return fam
    return None


def resolve_args(family: str, flavor: str, overrides: dict | None = None) -> TransformerArgs:
    fam = get_family(family)
    if flavor not in fam.flavors:
        raise ConfigError(f"unknown flavor '{flavor}' of {family}{_closest(flavor, sorted(fam.flavors))}")
    args = fam.flavors[flavor]
    if overrides:
        valid = set(TransformerArgs.__dataclass_fields__)
        for key in overrides:
            if key not in valid:
                raise ConfigError(f"unknown model override '{key}'{_closest(key, sorted(valid))}")
        args = replace(args, **overrides)
    return args


def build_meta(family: str, args: TransformerArgs) -> nn.Module:
    """The model on the meta device: no memory, ready for swaps and parallelisation."""
    with torch.device("meta"):
        return get_family(family).model_cls(args)
