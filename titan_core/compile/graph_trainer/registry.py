"""The graph-pass registry: `register_pass`, the `PassSettings` every pass receives, the table, and
`meta_like` for a pass that adds nodes.

This module exists only to break an import cycle: passes.py builds pipelines from the
registered passes and imports memory_policy.py so that its passes are registered, while
memory_policy.py registers its passes with `register_pass`. Both import this module,
which imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import GraphModule

PassFn = Callable[..., GraphModule]


@dataclass(frozen=True)
class PassSettings:
    """Keyword settings every pass receives."""

    memory_policy: str = "default"
    """default | full | offload (see memory_policy.py)."""
    debug: bool = False
    """Print op counts before and after each pass."""


@dataclass(frozen=True)
class GraphPass:
    name: str
    fn: PassFn
    numerics_changing: bool
    description: str


_PASSES: dict[str, GraphPass] = {}


def register_pass(name: str, *, numerics_changing: bool = False, description: str = "") -> Callable[[PassFn], PassFn]:
    """Decorator: register a pass under `name` in its tier."""

    def deco(fn: PassFn) -> PassFn:
        if name in _PASSES and _PASSES[name].fn is not fn:
            raise ValueError(f"graph pass '{name}' is already registered")
        _PASSES[name] = GraphPass(name, fn, numerics_changing, description or (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return deco


def passes_by_name() -> dict[str, GraphPass]:
    """Every pass registered so far, by name (a copy)."""
    return dict(_PASSES)


def meta_like(node, *, dtype=None, device=None) -> dict:
    """meta['val'] for a node computing a tensor like `node`'s, with another dtype or device."""
    val = node.meta["val"]
    with val.fake_mode:
        new = torch.empty_strided(val.shape, val.stride(), dtype=dtype or val.dtype, device=device or val.device)
    return {"val": new}
