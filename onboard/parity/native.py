"""The native side of parity, read from the workspace alone.

A workspace defines its native model with three files: recipe.toml ([model] family,
hf_config, overrides, module_file, adapter_file), adapter.py (HF <-> native) and, on the
port path, model.py. This module reads exactly those, so a person running test_parity.py
by hand and the rung see the same model, and it builds that model through titan_core's
own `resolve_model_args` / `build_meta_model` pieces (titan_core.models.model_builder), so the
training rungs, `onboard train` and export build the model parity verified. Only the
errors are classified here: a recipe's mistake is bad input, the workspace code's is the port's.

adapter.py contract (titan_core.models.model_builder.load_adapter_file): either a module-level
`ADAPTER` object, or module-level functions, providing `from_hf(sd) -> sd`,
`to_hf(sd) -> sd` and `args_from_hf(cfg) -> (TransformerArgs, used_keys)`
(`unconsumed_keys(cfg)` optional); port-specific config values travel in `args.extra`.
The recipe's `adapter_file` names it; a recipe that names none means the workspace's
adapter.py. model.py contract (port path): `build_model(args)` returning a module with
`forward(tokens) -> logits`, `loss(tokens, labels) -> (loss, ce)` and `init_weights(seed)`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from titan_core.config import ConfigError, load_config
from titan_core.config.hf_config import read_hf_config
from titan_core.models import get_family, resolve_args
from titan_core.models.model_builder import args_from_hf_config, build_meta_model, load_adapter_file


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
    adapter_file: Path | None = None
    """The adapter the recipe names (`[model] adapter_file`), else the workspace's adapter.py."""
    model_config: Any = None
    """The recipe's [model] section (titan_core's config) with `adapter_file` filled in."""
    lora: Any = None
    """The recipe's [lora] section (titan_core's config); parity proves it when it is enabled."""

    @property
    def path_kind(self) -> str:
        if self.family == "transformers":
            return "transformers"
        return "port" if self.module_file else "native"


def read_workspace(root: Path) -> WorkspaceModel:
    """What recipe.toml says the native model is; recipe paths are relative to the workspace."""
    recipe_path = root / "recipe.toml"
    if not recipe_path.is_file():
        raise WorkspaceError(f"no recipe.toml in workspace {root}")
    try:
        recipe = load_config(recipe_path)  # the loader anchors recipe paths at the workspace
    except ConfigError as e:
        raise WorkspaceError(str(e)) from None
    model = recipe.model

    hf_config = Path(model.hf_config) if model.hf_config else None
    if hf_config is None and (root / "config.json").is_file():
        hf_config = root / "config.json"  # a preset workspace may carry its exported config
    if not model.adapter_file:
        model.adapter_file = str(root / "adapter.py")
    return WorkspaceModel(
        root=root,
        family=model.family,
        flavor=model.flavor,
        hf_config_path=hf_config,
        overrides=dict(model.overrides),
        module_file=Path(model.module_file) if model.module_file else None,
        adapter_file=Path(model.adapter_file),
        model_config=model,
        lora=recipe.lora,
    )


def call_port(fn, what: str, *args):
    """Call workspace code (the adapter, model.py's model); its exceptions are the port's failure,
    named with the call."""
    try:
        return fn(*args)
    except Exception as e:  # anything the workspace code raises is reported, not crashed on
        raise PortError(f"{what} failed: {type(e).__name__}: {e}") from e


@contextlib.contextmanager
def _workspace_code(what: str):
    """Run workspace code: titan_core's ConfigError (a file missing, a function lacking) is
    bad input; anything else the code raises is the port's failure, reported with its type."""
    try:
        yield
    except ConfigError as e:
        raise WorkspaceError(str(e)) from None
    except Exception as e:  # the workspace's own code: its error fails the gate, never crashes it
        raise PortError(f"{what} failed: {type(e).__name__}: {e}") from e


def load_adapter(root: Path) -> Any:
    """The workspace adapter (the recipe's adapter_file, else adapter.py): `ADAPTER` if it
    defines one, else the module's functions; loaded by titan_core as training loads it."""
    ws = read_workspace(root) if (root / "recipe.toml").is_file() else None
    path = ws.adapter_file if ws is not None else root / "adapter.py"
    if not path.is_file():
        raise WorkspaceError(f"workspace adapter not found: {path}")
    with _workspace_code(f"importing {path}"):
        return load_adapter_file(path)


def native_hf_config(ws: WorkspaceModel) -> dict[str, Any]:
    """The HF config parity compares against: the workspace's config.json, or, for a preset
    workspace, the family's own export of its flavor."""
    if ws.hf_config_path is not None:
        return read_hf_config(ws.hf_config_path, require_model_type=True)
    args = resolve_args(ws.family, ws.flavor, ws.overrides)
    return get_family(ws.family).adapter.hf_config(args)


def native_args(ws: WorkspaceModel, adapter: Any, cfg: dict[str, Any]):
    """TransformerArgs from the config through the workspace adapter, then the recipe overrides
    (titan_core's `args_from_hf_config`, which training's `resolve_model_args` calls too)."""
    # a preset's overrides already shaped the exported config
    overrides = ws.overrides if ws.hf_config_path is not None else None
    try:
        return args_from_hf_config(adapter, cfg, overrides)
    except ConfigError as e:  # only the overrides raise it: the adapter's own errors are not ConfigErrors
        raise WorkspaceError(f"recipe [model.overrides]: {e}") from None
    except Exception as e:  # the workspace adapter's own code; its error is a port failure
        raise PortError(f"adapter.args_from_hf failed: {type(e).__name__}: {e}") from e


def build_native(ws: WorkspaceModel, args, *, seed: int) -> nn.Module:
    """The native model on CPU in fp32, initialised from `seed` before any weights load:
    titan_core's `build_meta_model` of the recipe's [model] section, as training builds it."""
    with _workspace_code("building the native model"):
        model = build_meta_model(ws.model_config, args)
        model = model.to_empty(device="cpu").float()
        model.init_weights(seed=seed)
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
