"""Model families: name -> (model class, flavors, HF adapter), and building a model on meta."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from titan_core.config.loader import ConfigError, did_you_mean
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.mapping_errors import ArchitectureError
from titan_core.models.common.hf_adapter import HFAdapter
from titan_core.models.common.validate import validate_args

FAMILY_NAMES = ("llama3", "qwen3", "qwen3_moe", "glimmer")
"""The native decoder families: each claims the HF model_types its adapter reads."""
DIFFUSION_FAMILIES = ("flux",)
"""Diffusion transformers trained with a flow loss (models/flux): read from a diffusers config, not a model_type."""
TRANSFORMERS_FAMILY = "transformers"
"""The transformers path (models/transformers): HF's own class for any model_type; chosen by name, claims none."""


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_cls: Callable[[TransformerArgs], nn.Module]
    flavors: dict[str, TransformerArgs]
    adapter: HFAdapter
    resync: Callable[[TransformerArgs, dict], TransformerArgs] | None = None
    """For a family that keeps its own config as a table under its name in args.extra (flux): the
    args with their summary fields (n_layers, dim, ...) re-derived from that table after the
    overrides (second argument) changed it, so the sizes a user changes there are the model's."""


def get_family(name: str) -> ModelFamily:
    known = [*FAMILY_NAMES, *DIFFUSION_FAMILIES, TRANSFORMERS_FAMILY]
    if name not in known:
        raise ConfigError(f"unknown model family '{name}'{did_you_mean(name, known)}")
    module = importlib.import_module(f"titan_core.models.{name}")
    return module.FAMILY


def family_for_hf_model_type(model_type: str) -> ModelFamily | None:
    for name in (*FAMILY_NAMES, *DIFFUSION_FAMILIES):
        fam = get_family(name)
        if model_type in fam.adapter.hf_model_types:
            return fam
    return None


def resolve_args(family: str, flavor: str, overrides: dict | None = None) -> TransformerArgs:
    fam = get_family(family)
    if flavor not in fam.flavors:
        raise ConfigError(f"unknown flavor '{flavor}' of {family}{did_you_mean(flavor, sorted(fam.flavors))}")
    return apply_model_overrides(fam.flavors[flavor], overrides)


def apply_model_overrides(args: TransformerArgs, overrides: dict | None) -> TransformerArgs:
    """`args` with the `model.overrides` fields replaced (an `extra` table merges into
    args.extra, key by key, and a table inside it field by field), checked against the structural rules (models/common/validate.py).

    ConfigError naming an unknown field, or an override that breaks a rule; an
    ArchitectureError (an AdapterError) when args that came in already break one (an
    adapter that skipped the checks). Every recipe's args pass here, so a hand edit of the
    recipe is refused before a model is built.
    """
    overrides = overrides or {}
    valid = set(TransformerArgs.__dataclass_fields__)
    for key in overrides:
        if key not in valid:
            raise ConfigError(f"unknown model override '{key}'{did_you_mean(key, sorted(valid))}")
    if "extra" in overrides:
        if not isinstance(overrides["extra"], dict):
            raise ConfigError(f"model override 'extra' must be a table of port fields, got {overrides['extra']!r}")
        # a table inside extra (a family's own config, e.g. flux's) merges field by field too
        merged = {
            k: {**args.extra[k], **v} if isinstance(v, dict) and isinstance(args.extra.get(k), dict) else v
            for k, v in overrides["extra"].items()
        }
        overrides = {**overrides, "extra": {**args.extra, **merged}}
    if overrides:
        args = replace(args, **overrides)
        for name in DIFFUSION_FAMILIES:
            if isinstance(overrides.get("extra", {}).get(name), dict) and get_family(name).resync:
                args = get_family(name).resync(args, overrides)
    try:
        validate_args(args, names={k: f"model.overrides.{k}" for k in overrides})
    except ArchitectureError as e:
        if set(e.fields) & set(overrides):
            raise ConfigError(str(e)) from None
        raise
    return args


def build_meta(family: str, args: TransformerArgs) -> nn.Module:
    """The model on the meta device: no memory, ready for swaps and parallelisation."""
    with torch.device("meta"):
        return get_family(family).model_cls(args)
