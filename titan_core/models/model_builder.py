"""Model config section -> (family, args, model on meta): the one way a recipe's model is built.

Two sources of architecture, in order of precedence: an HF config.json, read by the
`adapter_file`'s adapter when the recipe names one (an adapter.py beside it) and by the
family's otherwise, else the named flavor; `overrides` apply last. A `module_file` (a
ported model.py) replaces the family's model class; its `build_model(args)`
receives the same args, port-specific config values included (`args.extra`, filled by the
adapter). Training, export and parity all build through `resolve_model_args` and
`build_meta_model`, so they cannot disagree on the model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from titan_core.config.hf_config import read_hf_config
from titan_core.config.loader import ConfigError
from titan_core.config.sections import Model as ModelConfig
from titan_core.models.common.args import ModelArgs
from titan_core.models.common.hf_adapter import AdapterError
from titan_core.models.common.protocol import TrainableModel, check_trainable
from titan_core.models.registry import apply_model_overrides, build_meta, get_family, resolve_args


ADAPTER_FUNCTIONS = ("from_hf", "to_hf", "args_from_hf")


def resolve_model_args(cfg: ModelConfig) -> ModelArgs:
    """The recipe's architecture: its config.json through `model_adapter(cfg)`, else its flavor.

    An adapter's AdapterError (a config it cannot map) becomes a ConfigError naming the
    config file; anything else an adapter file's own code raises propagates.
    """
    if not cfg.hf_config:
        return resolve_args(cfg.family, cfg.flavor, cfg.overrides)
    try:
        return args_from_hf_config(model_adapter(cfg), read_hf_config(cfg.hf_config), cfg.overrides)
    except AdapterError as e:
        raise ConfigError(f"{cfg.hf_config}: {e}") from None


def args_from_hf_config(adapter: Any, hf_cfg: dict, overrides: dict | None = None) -> ModelArgs:
    """`adapter.args_from_hf(hf_cfg)`'s args with `overrides` applied (ConfigError for a bad
    override; whatever the adapter raises propagates, so a caller can tell the two apart)."""
    args, _ = adapter.args_from_hf(hf_cfg)
    if not isinstance(args, ModelArgs):
        raise TypeError(f"args_from_hf returned {type(args).__name__}, not (ModelArgs: TransformerArgs, ..., used keys)")
    return apply_model_overrides(args, overrides)


def model_adapter(cfg: ModelConfig) -> Any:
    """The HF adapter of the recipe: its `adapter_file`'s when set, else the family's."""
    return load_adapter_file(cfg.adapter_file) if cfg.adapter_file else get_family(cfg.family).adapter


def load_adapter_file(path: str | Path) -> Any:
    """The adapter a Python file defines: a module-level `ADAPTER` object, else the module's
    own `args_from_hf`, `from_hf` and `to_hf` functions (`hf_config(args)`,
    `unconsumed_keys(cfg)` optional). ConfigError for a missing file or a missing function;
    whatever the file's own code raises propagates."""
    if not Path(path).is_file():
        raise ConfigError(f"model.adapter_file not found: {path}")
    module = import_module_file(path, prefix="titan_adapter")
    adapter = getattr(module, "ADAPTER", module)
    lacking = [f for f in ADAPTER_FUNCTIONS if not callable(getattr(adapter, f, None))]
    if lacking:
        raise ConfigError(f"{path} provides no {', '.join(lacking)} (define ADAPTER or module functions)")
    return adapter


def import_module_file(path: str | Path, *, prefix: str = "titan_port") -> ModuleType:
    """Import the Python file at `path` as a module of its own (e.g. a recipe's module_file, a model.py).

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


def build_meta_model(cfg: ModelConfig, args: ModelArgs) -> TrainableModel:
    """The recipe's model class (the `module_file`'s `build_model`, else the family's) on meta.

    ConfigError naming the member when the model lacks one of `TrainableModel`'s (a port's
    model.py that does not subclass ModelBase and leaves one out)."""
    if cfg.module_file:
        module = load_module_file(cfg.module_file)
        with torch.device("meta"):
            model = module.build_model(args)
        check_trainable(model, f"{cfg.module_file} build_model(args)")
        return model
    model = build_meta(cfg.family, args)
    check_trainable(model, f"model family '{cfg.family}'")
    return model


def build_model_from_config(cfg: ModelConfig) -> tuple[str, ModelArgs, TrainableModel]:
    args = resolve_model_args(cfg)
    return cfg.family, args, build_meta_model(cfg, args)


def materialize_on_cpu(model: TrainableModel, seed: int, dtype: torch.dtype) -> TrainableModel:
    """A meta model made real on the CPU in one process, ready for a checkpoint to overwrite every
    parameter: initialised first because buffers (rope tables) and tied weights are made there,
    then cast to the dtype the checkpoint was stored in."""
    model.to_empty(device="cpu")
    model.init_weights(seed=seed)
    return model.to(dtype)
