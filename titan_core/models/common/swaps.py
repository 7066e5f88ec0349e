"""Module-swap registry: replace parts of a model tree, chosen by module-path glob.

A swap runs on the model while it still lives on the meta device, before any weights
exist, so replacing a module costs nothing and the replacement is initialised with the
rest of the model. Kernels and execution variants are swaps, which makes each of them
one flag that can be compared against the module it replaces.

A swap states which module classes it may replace (`replaces`) and which it builds
(`produces`). A module at a matching path of any other class (a model's own attention
core, experts or loss head) is never replaced: the swap is refused with the path, the
class found and the classes it replaces, because replacing it would silently drop what
that module does. Classes are compared exactly, so a subclass of a library module is the
model's own too. What one swap on a path produces, another swap on the same path may
replace: kernels replace each other.

A swap with `select` casts its pattern wide (every linear of the model) and takes only the
modules its filter accepts: a module of another class is no candidate, one of its classes the
filter turns down is skipped with the reason, logged, and `swap_selection` lists both. Such a
swap that takes nothing is refused (`SwapNotApplicable`) with the reasons: the flag would do
nothing.
"""

from __future__ import annotations

import fnmatch
import logging
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from torch import nn

from titan_core.config.loader import ConfigError, did_you_mean

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel

log = logging.getLogger("titan_core.swaps")

#: factory(old_module, module_path) -> new module
Factory = Callable[[nn.Module, str], nn.Module]
#: select(module, module_path, model) -> None to take the module, else why it is skipped
Select = Callable[[nn.Module, str, "TrainableModel"], "str | None"]


class SwapNotApplicable(ConfigError):
    """A swap matched a module of a class it does not replace (a model's own module)."""


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
    replaces: tuple[type, ...] | None = None
    """Classes this swap was written to replace; None: any module (no contract to keep)."""
    produces: tuple[type, ...] = ()
    """Classes the factory returns; a sibling swap on the same pattern may replace them."""
    select: Select | None = None
    """Filter over the matched modules of the classes it replaces (a subclass is skipped as the
    model's own); None: the swap takes every match."""


_REGISTRY: dict[str, Swap] = {}


def _classes(value: type | tuple[type, ...] | None) -> tuple[type, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, type) else tuple(value)


def register_swap(
    name: str,
    pattern: str,
    description: str = "",
    *,
    replaces: type | tuple[type, ...] | None = None,
    produces: type | tuple[type, ...] | None = None,
    select: Select | None = None,
) -> Callable[[Factory], Factory]:
    """Decorator: register `factory` under `name` for modules whose path matches `pattern`.

    `replaces`: the module classes the factory can take (exact classes); a matched module
    of another class makes `apply_swaps` refuse. `produces`: the classes it returns.
    `select`: take only the matches it accepts (module docstring).
    """

    def deco(factory: Factory) -> Factory:
        if name in _REGISTRY and _REGISTRY[name].factory is not factory:
            raise ValueError(f"swap '{name}' is already registered")
        rep = None if replaces is None else _classes(replaces)
        _REGISTRY[name] = Swap(name, pattern, factory, description, rep, _classes(produces), select)
        return factory

    return deco


def get_swap(name: str) -> Swap:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown swap '{name}'{did_you_mean(name, sorted(_REGISTRY))}")
    return _REGISTRY[name]


def registered_swaps() -> dict[str, Swap]:
    return dict(_REGISTRY)


def replaceable_classes(swap: Swap) -> tuple[type, ...] | None:
    """Classes `swap` may replace: its own `replaces` plus what swaps on its pattern produce.

    None: the swap takes any module.
    """
    if swap.replaces is None:
        return None
    out = list(swap.replaces)
    for other in _REGISTRY.values():
        if other.pattern == swap.pattern:
            out += [c for c in other.produces if c not in out]
    return tuple(out)


def _matches(paths: list[str], swap: Swap, model: TrainableModel) -> list[str]:
    # a model whose tree is not the native decoder's (the transformers path) says where the
    # native paths are in it: `swap_paths` {native pattern: its own pattern}
    # (or patterns: a stack whose layers keep their attention under different names)
    own = model.swap_paths.get(swap.pattern, swap.pattern)
    patterns = (own,) if isinstance(own, str) else tuple(own)
    return [p for p in paths if any(fnmatch.fnmatchcase(p, pat) for pat in patterns)]


def _refusal(model: TrainableModel, swap: Swap, hits: list[str]) -> str | None:
    """Why `swap` must not replace the modules at `hits`, or None when it may replace them all."""
    allowed = replaceable_classes(swap)
    if allowed is None:
        return None
    foreign: dict[type, list[str]] = {}
    for p in hits:
        cls = type(model.get_submodule(p))
        if cls not in allowed:
            foreign.setdefault(cls, []).append(p)
    if not foreign:
        return None
    found = []
    for cls, where in foreign.items():
        at = swap.pattern if len(where) == len(hits) else ", ".join(where[:3]) + (" ..." if len(where) > 3 else "")
        found.append(f"{at} is {cls.__qualname__}")
    names = ", ".join(sorted(c.__name__ for c in allowed))
    own = " / ".join(c.__qualname__ for c in foreign)
    # a model that knows why its module is its own says so (`swap_refusals`: {native pattern: why})
    why = model.swap_refusals.get(swap.pattern)
    return (
        f"{'; '.join(found)}, not one of the classes swap '{swap.name}' replaces ({names}); "
        f"replacing it would drop what {own} does" + (f" ({why})" if why else "")
    )


def _select(model: TrainableModel, swap: Swap, hits: list[str]) -> tuple[list[str], dict[str, str]]:
    """(paths `swap` takes, {path it skips: why}) among `hits`; without `select` it takes them all."""
    if swap.select is None:
        return hits, {}
    allowed = replaceable_classes(swap)
    taken: list[str] = []
    skipped: dict[str, str] = {}
    for p in hits:
        module = model.get_submodule(p)
        if allowed is not None and not isinstance(module, allowed):
            continue  # the pattern casts wide; a norm or a block is no candidate, nothing to report
        if allowed is not None and type(module) not in allowed:
            skipped[p] = f"{type(module).__qualname__} is the model's own subclass, not replaced"
        elif (why := swap.select(module, p, model)) is not None:
            skipped[p] = why
        else:
            taken.append(p)
    return taken, skipped


def _nothing_taken(swap: Swap, skipped: dict[str, str]) -> str:
    if not skipped:
        names = ", ".join(c.__name__ for c in replaceable_classes(swap) or ())
        return f"no {names or 'module'} matches '{swap.pattern}'"
    shown = [f"{p} ({why})" for p, why in list(skipped.items())[:4]]
    more = f" and {len(skipped) - 4} more" if len(skipped) > 4 else ""
    return f"every candidate is skipped: {'; '.join(shown)}{more}"


def swap_selection(model: TrainableModel, name: str) -> tuple[list[str], dict[str, str]]:
    """(module paths swap `name` would replace, {path it would skip: why}); nothing is replaced.

    For a swap without `select` the second is empty and the first is every pattern match.
    """
    swap = get_swap(name)
    paths = [p for p, _ in model.named_modules() if p]
    return _select(model, swap, _matches(paths, swap, model))


def swap_applicability(model: TrainableModel, names: list[str]) -> dict[str, str | None]:
    """{swap name: None if `apply_swaps(model, [name])` would replace something, else why not}.

    Nothing is replaced. Reasons: no module matches the pattern, or a matched module is
    of a class the swap does not replace. `model` may live on the meta device.
    """
    paths = [p for p, _ in model.named_modules() if p]
    out: dict[str, str | None] = {}
    for name in names:
        swap = get_swap(name)
        hits = _matches(paths, swap, model)
        if swap.select is not None:
            hits, skipped = _select(model, swap, hits)
            out[name] = _refusal(model, swap, hits) if hits else _nothing_taken(swap, skipped)
            continue
        out[name] = _refusal(model, swap, hits) if hits else f"no module matches '{swap.pattern}'"
    return out


def apply_swaps(model: TrainableModel, names: list[str]) -> dict[str, str]:
    """Apply the named swaps to `model` in place; return {module_path: swap_name}.

    Two swaps matching the same module is a configuration error: the result would
    depend on their order, which nobody should have to reason about. A swap that
    matches a module of a class it does not replace raises `SwapNotApplicable` before
    anything is replaced.
    """
    swaps = [get_swap(n) for n in names]
    claimed: dict[str, str] = {}
    plan: list[tuple[str, Swap]] = []
    paths = [p for p, _ in model.named_modules() if p]
    for swap in swaps:
        hits = _matches(paths, swap, model)
        if swap.select is not None:
            hits, skipped = _select(model, swap, hits)
            for p, why in skipped.items():
                log.info("swap %s: skipped %s: %s", swap.name, p, why)
            if not hits:
                why = _nothing_taken(swap, skipped)
                raise SwapNotApplicable(f"swap '{swap.name}' does not apply to this model: {why}")
        if not hits:
            warnings.warn(f"swap '{swap.name}' matched no module (pattern '{swap.pattern}')", stacklevel=2)
            log.warning("swap %s matched no module (pattern %s)", swap.name, swap.pattern)
        refusal = _refusal(model, swap, hits)
        if refusal is not None:
            raise SwapNotApplicable(f"swap '{swap.name}' does not apply to this model: {refusal}")
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
        if swap.produces and type(new) not in swap.produces:
            raise TypeError(f"swap '{swap.name}' built {type(new).__name__}, not one of the classes it declares")
        setattr(parent, child, new)
        log.info("swap %s: %s %s -> %s", swap.name, path, type(old).__name__, type(new).__name__)
    return claimed
