"""Model config section -> (family, args, model on meta).

Three sources of architecture, in order of precedence: an HF config.json (through the
family adapter), else the named flavor; `overrides` apply last. A `module_file` (a
workspace's ported model.py) replaces the family's model class but keeps its args.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import torch
from torch import nn

from titan_core.config.loader import ConfigError, _closest
from titan_core.config.sections import Model as ModelConfig
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.hf_adapter import AdapterError
from titan_core.models.registry import build_meta, get_family, resolve_args


def read_hf_config(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"HF config not found: {path}")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"malformed JSON in {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return cfg


def resolve_model_args(cfg: ModelConfig) -> TransformerArgs:
    if not cfg.hf_config:
        return resolve_args(cfg.family, cfg.flavor, cfg.overrides)
    family = get_family(cfg.family)
    try:
        args, _ = family.adapter.args_from_hf(read_hf_config(cfg.hf_config))
    except AdapterError as e:
        raise ConfigError(f"{cfg.hf_config}: {e}") from None
    if cfg.overrides:
        valid = {f.name for f in dataclasses.fields(TransformerArgs)}
        for key in cfg.overrides:
            if key not in valid:
                raise ConfigError(f"unknown model override '{key}'{_closest(key, sorted(valid))}")
        args = dataclasses.replace(args, **cfg.overrides)
    return args


def load_module_file(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model.module_file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"titan_port_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "build_model"):
        raise ConfigError(f"{path} defines no build_model(args)")
    return module


def build_model_from_config(cfg: ModelConfig) -> tuple[str, TransformerArgs, nn.Module]:
    args = resolve_model_args(cfg)
    if cfg.module_file:
        module = load_module_file(cfg.module_file)
        with torch.device("meta"):
            model = module.build_model(args)
    else:
        model = build_meta(cfg.family, args)
    return cfg.family, args, model
