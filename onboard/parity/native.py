"""The native side of parity, read from the workspace alone.

A workspace defines its native model with three files: recipe.toml ([model] family,
hf_config, overrides, module_file), adapter.py (HF <-> native) and, on the port path,
model.py. This module reads exactly those, so a person running test_parity.py by hand and
the rung see the same model.

adapter.py contract: either a module-level `ADAPTER` object, or module-level functions,
providing `from_hf(sd) -> sd`, `to_hf(sd) -> sd` and `args_from_hf(cfg) -> (TransformerArgs, used_keys)`
(`unconsumed_keys(cfg)` optional). model.py contract (port path): `build_model(args)`
returning a module with `forward(tokens) -> logits`, `loss(tokens, labels) -> (loss, ce)`
and `init_weights(seed)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

ADAPTER_FUNCTIONS = ("from_hf", "to_hf", "args_from_hf")


class WorkspaceError(ValueError):
    """The workspace is missing a file or has a malformed one (bad input, exit 2)."""


class PortError(RuntimeError):
    """The workspace's own code (adapter.py, model.py) raised: the port is wrong, the gate fails."""


@dataclass
class WorkspaceModel:
    """What the workspace says the native model is."""

    root: Path
    family: str
    flavor: str
    hf_config_path: Path | None
    """The HF config.json the architecture comes from; None for a --preset workspace."""
    overrides: dict[str, Any]
    module_file: Path | None
    """model.py on the port path."""

    @property
    def path_kind(self) -> str:
        return "port" if self.module_file else "native"


def read_workspace(root: Path) -> WorkspaceModel:
    """What recipe.toml says the native model is; recipe paths are relative to the workspace."""
    from titan_core.config import ConfigError, load_config

    recipe_path = root / "recipe.toml"
    if not recipe_path.is_file():
        raise WorkspaceError(f"no recipe.toml in workspace {root}")
    try:
        model = load_config(recipe_path).model  # the loader anchors recipe paths at the workspace
    except ConfigError as e:
        raise WorkspaceError(str(e)) from None

    hf_config = Path(model.hf_config) if model.hf_config else None
    if hf_config is None and (root / "config.json").is_file():
        hf_config = root / "config.json"  # a preset workspace may carry its exported config
    return WorkspaceModel(
        root=root,
        family=model.family,
        flavor=model.flavor,
        hf_config_path=hf_config,
        overrides=dict(model.overrides),
        module_file=Path(model.module_file) if model.module_file else None,
    )


def _import_file(path: Path, role: str) -> ModuleType:
    from titan_core.model_builder import import_module_file

    if not path.is_file():
        raise WorkspaceError(f"workspace {role} not found: {path}")
    try:
        module = import_module_file(path, prefix=f"onboard_ws_{role}")
    except Exception as e:  # any error in the workspace's own code is the port's failure, reported with its type
        raise PortError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    return module


def load_adapter(root: Path) -> Any:
    """The workspace adapter: `ADAPTER` if adapter.py defines it, else the module's functions."""
    module = _import_file(root / "adapter.py", "adapter")
    adapter = getattr(module, "ADAPTER", module)
    lacking = [f for f in ADAPTER_FUNCTIONS if not callable(getattr(adapter, f, None))]
    if lacking:
        raise WorkspaceError(
            f"{root / 'adapter.py'} provides no {', '.join(lacking)} (define ADAPTER or module functions)"
        )
    return adapter


def native_hf_config(ws: WorkspaceModel) -> dict[str, Any]:
    """The HF config parity compares against: the workspace's config.json, or, for a preset
    workspace, the family's own export of its flavor."""
    from onboard.parity.upstream import read_hf_config
    from titan_core.models import get_family, resolve_args

    if ws.hf_config_path is not None:
        return read_hf_config(ws.hf_config_path)
    args = resolve_args(ws.family, ws.flavor, ws.overrides)
    return get_family(ws.family).adapter.hf_config(args)


def native_args(ws: WorkspaceModel, adapter: Any, cfg: dict[str, Any]):
    """TransformerArgs from the config through the workspace adapter, then the recipe overrides."""
    from titan_core.config import ConfigError
    from titan_core.models import apply_model_overrides

    try:
        args, _ = adapter.args_from_hf(cfg)
    except Exception as e:  # the workspace adapter's own code; its error is a port failure
        raise PortError(f"adapter.args_from_hf failed: {type(e).__name__}: {e}") from e
    if ws.hf_config_path is None or not ws.overrides:
        return args  # a preset's overrides already shaped the exported config
    try:
        return apply_model_overrides(args, ws.overrides)
    except ConfigError as e:
        raise WorkspaceError(f"recipe [model.overrides]: {e}") from None


def build_native(ws: WorkspaceModel, args, *, seed: int) -> nn.Module:
    """The native model on CPU in fp32, initialised from `seed` before any weights load."""
    from titan_core.models import build_meta

    try:
        if ws.module_file is not None:
            build = getattr(_import_file(ws.module_file, "model"), "build_model", None)
            if not callable(build):
                raise WorkspaceError(f"{ws.module_file} defines no build_model(args)")
            with torch.device("meta"):
                model = build(args)
        else:
            model = build_meta(ws.family, args)
        model = model.to_empty(device="cpu").float()
        if hasattr(model, "init_weights"):
            model.init_weights(seed=seed)
    except WorkspaceError:
        raise
    except Exception as e:  # a model the port cannot build is the port's failure
        raise PortError(f"building the native model failed: {type(e).__name__}: {e}") from e
    return model.eval()


@dataclass
class LoadReport:
    missing: list[str] = field(default_factory=list)
    """Native parameters the converted checkpoint did not provide (they keep their init)."""
    unexpected: list[str] = field(default_factory=list)
    """Converted keys the native model has no parameter for."""
    shape_mismatch: list[str] = field(default_factory=list)
    """'key: checkpoint shape vs model shape' for keys skipped because shapes differ."""


def load_converted(model: nn.Module, native_sd: dict[str, torch.Tensor]) -> LoadReport:
    """Load what fits and report the rest, so the forward still runs and localisation can
    point at the module whose weights did not arrive."""
    own = model.state_dict()
    report = LoadReport()
    fitting = {}
    for key, value in native_sd.items():
        if key in own and own[key].shape != value.shape:
            report.shape_mismatch.append(f"{key}: {tuple(value.shape)} vs {tuple(own[key].shape)}")
        else:
            fitting[key] = value
    result = model.load_state_dict(fitting, strict=False)
    report.missing = sorted(set(result.missing_keys) | {m.split(":")[0] for m in report.shape_mismatch})
    report.unexpected = sorted(result.unexpected_keys)
    return report
