"""Model config section -> (family, args, model on meta).

Three sources of architecture, in order of precedence: an HF config.json (through the
family adapter), else the named flavor; `overrides` apply last. A `module_file` (a
workspace's ported model.py) replaces the family's model class but keeps its args.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from titan_core.config.hf_config import read_hf_config
from titan_core.config.loader import ConfigError
from titan_core.config.sections import Model as ModelConfig
from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.hf_adapter import AdapterError
from titan_core.models.registry import apply_model_overrides, build_meta, get_family, resolve_args


def resolve_model_args(cfg: ModelConfig) -> TransformerArgs:
    if not cfg.hf_config:
        return resolve_args(cfg.family, cfg.flavor, cfg.overrides)
    family = get_family(cfg.family)
    try:
        args, _ = family.adapter.args_from_hf(read_hf_config(cfg.hf_config))
    except AdapterError as e:
        raise ConfigError(f"{cfg.hf_config}: {e}") from None
    return apply_model_overrides(args, cfg.overrides)


def import_module_file(path: str | Path, *, prefix: str = "titan_port") -> ModuleType:
    """Import the Python file at `path` as a module of its own (e.g. a workspace's model.py).

    The module is named `<prefix>_<stem>_<hash of the path>` and registered in sys.modules
    (dataclasses and pickling look modules up by name). ConfigError when there is no such
    file; whatever the file's own code raises propagates.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"module file not found: {path}")
    name = f"{prefix}_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_module_file(path: str | Path) -> ModuleType:
    """The `model.module_file` of a recipe: a Python file defining `build_model(args)`."""
    if not Path(path).is_file():
        raise ConfigError(f"model.module_file not found: {path}")
    module = import_module_file(path)
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
