"""Module-swap registry: replace parts of a model tree, chosen by module-path glob.

A swap runs on the model while it still lives on the meta device, before any weights
exist, so replacing a module costs nothing and the replacement is initialised with the
rest of the model. Kernels and execution variants are swaps, which makes each of them
one flag that can be compared against the module it replaces.
"""

from __future__ import annotations

import fnmatch
import logging
import warnings
from dataclasses import dataclass
from typing import Callable

from torch import nn

from titan_core.config.loader import ConfigError, did_you_mean

log = logging.getLogger("titan_core.swaps")

#: factory(old_module, module_path) -> new module
Factory = Callable[[nn.Module, str], nn.Module]


@dataclass(frozen=True)
class Swap:
    name: str
    """Registry name, e.g. `attention.naive`."""
    pattern: str
    """fnmatch glob over dotted module paths, e.g. `layers.*.attention.core`."""
    factory: Factory
    """Builds the replacement from the module it replaces."""
    description: str = ""
    """One line for listings and logs."""


_REGISTRY: dict[str, Swap] = {}


def register_swap(name: str, pattern: str, description: str = "") -> Callable[[Factory], Factory]:
    """Decorator: register `factory` under `name` for modules whose path matches `pattern`."""

    def deco(factory: Factory) -> Factory:
        if name in _REGISTRY and _REGISTRY[name].factory is not factory:
            raise ValueError(f"swap '{name}' is already registered")
        _REGISTRY[name] = Swap(name, pattern, factory, description)
        return factory

    return deco


def get_swap(name: str) -> Swap:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown swap '{name}'{did_you_mean(name, sorted(_REGISTRY))}")
    return _REGISTRY[name]


def registered_swaps() -> dict[str, Swap]:
    return dict(_REGISTRY)


def apply_swaps(model: nn.Module, names: list[str]) -> dict[str, str]:
    """Apply the named swaps to `model` in place; return {module_path: swap_name}.

    Two swaps matching the same module is a configuration error: the result would
    depend on their order, which nobody should have to reason about.
    """
    swaps = [get_swap(n) for n in names]
    claimed: dict[str, str] = {}
    plan: list[tuple[str, Swap]] = []
    paths = [p for p, _ in model.named_modules() if p]
    for swap in swaps:
        hits = [p for p in paths if fnmatch.fnmatchcase(p, swap.pattern)]
        if not hits:
            warnings.warn(f"swap '{swap.name}' matched no module (pattern '{swap.pattern}')", stacklevel=2)
            log.warning("swap %s matched no module (pattern %s)", swap.name, swap.pattern)
        for p in hits:
            if p in claimed:
                raise ConfigError(f"swaps '{claimed[p]}' and '{swap.name}' both claim module '{p}'")
            claimed[p] = swap.name
            plan.append((p, swap))
    for path, swap in plan:
        parent_path, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        old = getattr(parent, child)
        new = swap.factory(old, path)
        setattr(parent, child, new)
        log.info("swap %s: %s %s -> %s", swap.name, path, type(old).__name__, type(new).__name__)
    return claimed
