"""What parity reads inside the upstream forward beyond soft-caps and routing (features.py's Probe
holds these): how far each layer's attention scores spread and how much mass a sink takes
(`ScoreWatch`, fed from the upstream's eager attention), and every clamp the forward applies
(`ClampWatch`, a TorchFunctionMode: the clamp may sit anywhere in upstream code, e.g. GPT-OSS's
experts clamp their gate and up projections inside the expert loop, where no hook reaches).

Measurement only: which of these a config declares, and what counts as active, is active_range.py's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

SAMPLE = 1 << 16  # values kept per clamp call for the quantile that sets the next scale

LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_of(module_name: str) -> int | None:
    """The decoder layer a module belongs to (`model.layers.3.self_attn` -> 3), None outside the layers."""
    found = LAYER_INDEX.search(module_name + ".")
    return int(found.group(1)) if found else None


class ScoreWatch:
    """Per upstream layer: the spread of the attention scores (the mean, over query rows with at
    least two keys they may see, of the standard deviation of those keys' scores) and, where the
    attention module holds sinks, the mean probability the sink takes."""

    def __init__(self):
        self.spread: dict[int, list[float]] = {}
        self.sink_mass: dict[int, list[float]] = {}

    @torch.no_grad()
    def add(self, layer: int | None, scores: torch.Tensor, valid: torch.Tensor, sinks: torch.Tensor | None) -> None:
        if layer is None:
            return
        s = scores.detach().double()
        keep = valid.expand_as(s)
        n = keep.sum(-1)
        rows = n >= 2
        if bool(rows.any()):
            x = s.masked_fill(~keep, 0.0)
            mean = x.sum(-1) / n.clamp(min=1)
            var = ((s - mean[..., None]).pow(2) * keep).sum(-1) / n.clamp(min=1)
            self.spread.setdefault(layer, []).append(float(var.sqrt()[rows].mean()))
        if sinks is not None and sinks.numel() == s.shape[1]:
            lse = s.masked_fill(~keep, -math.inf).logsumexp(-1)  # [B, H, S]
            sink = sinks.detach().double().reshape(1, -1, 1)
            mass = torch.sigmoid(sink - lse)[n >= 1]
            if mass.numel():
                self.sink_mass.setdefault(layer, []).append(float(mass.mean()))

    def layer_spread(self) -> dict[int, float]:
        return {i: min(v) for i, v in self.spread.items()}

    def layer_sink_mass(self) -> dict[int, float]:
        return {i: min(v) for i, v in self.sink_mass.items()}


CLAMPS = {
    torch.clamp: ("min", "max"), torch.clip: ("min", "max"), torch.Tensor.clamp: ("min", "max"),
    torch.Tensor.clip: ("min", "max"), torch.Tensor.clamp_: ("min", "max"), torch.Tensor.clip_: ("min", "max"),
    torch.clamp_min: ("min",), torch.clamp_max: ("max",), torch.Tensor.clamp_min: ("min",),
    torch.Tensor.clamp_max: ("max",), torch.Tensor.clamp_min_: ("min",), torch.Tensor.clamp_max_: ("max",),
}  # fmt: skip
"""Every clamp entry point, with the names of the bounds it takes after the input."""


@dataclass
class ClampSite:
    """One clamp of the upstream forward: where it ran, its bounds, what it saw and clipped."""

    module: str
    low: float | None
    high: float | None
    seen: int = 0
    clipped: int = 0
    samples: list[torch.Tensor] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.clipped / self.seen if self.seen else 0.0

    def bound(self) -> float:
        return max(abs(b) for b in (self.low, self.high) if b is not None)

    def quantile(self, q: float) -> float | None:
        """The q-quantile of the magnitudes this clamp saw (its bound sits on the same scale)."""
        if not self.samples:
            return None
        values = torch.cat(self.samples)
        return float(torch.quantile(values[:: max(1, values.numel() // SAMPLE)], q)) if values.numel() else None


def _bounds(func, args, kwargs) -> tuple[float | None, float | None] | None:
    """(low, high) when both given bounds are plain numbers; None for a tensor bound (not a config value)."""
    names = CLAMPS[func]
    given = dict(zip(names, args[1:]))
    given.update({k: kwargs[k] for k in names if k in kwargs})
    if any(v is not None and not isinstance(v, (int, float)) for v in given.values()):
        return None
    low, high = given.get("min"), given.get("max")
    return (None if low is None else float(low), None if high is None else float(high))


class ClampWatch(TorchFunctionMode):
    """Records every clamp with numeric bounds that the upstream forward runs, keyed by the innermost
    upstream module running it and its bounds. Hooks on every module of `model` keep that module
    stack; the mode itself only counts (strictly beyond a bound: there the clamp changes the value)."""

    def __init__(self, model: nn.Module, *, sample: bool = False):
        super().__init__()
        self.sites: dict[tuple[str, float | None, float | None], ClampSite] = {}
        self.sample = sample
        self._stack: list[str] = []
        self._handles = []
        for name, mod in model.named_modules():
            self._handles.append(mod.register_forward_pre_hook(self._enter(name)))
            self._handles.append(mod.register_forward_hook(self._leave))

    def _enter(self, name: str):
        def hook(*_args) -> None:
            self._stack.append(name)

        return hook

    def _leave(self, *_args) -> None:  # returns None: a forward hook's return value would replace the output
        if self._stack:
            self._stack.pop()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in CLAMPS and args and torch.is_tensor(args[0]) and args[0].is_floating_point():
            bounds = _bounds(func, args, kwargs)
            if bounds is not None and bounds != (None, None):
                self._count(args[0], *bounds)
        return func(*args, **kwargs)

    @torch.no_grad()
    def _count(self, x: torch.Tensor, low: float | None, high: float | None) -> None:
        module = self._stack[-1] if self._stack else ""
        site = self.sites.setdefault((module, low, high), ClampSite(module, low, high))
        x = x.detach()
        beyond = torch.zeros_like(x, dtype=torch.bool)
        if low is not None:
            beyond |= x < low
        if high is not None:
            beyond |= x > high
        site.seen += x.numel()
        site.clipped += int(beyond.sum())
        if self.sample:
            flat = x.float().abs().flatten()
            site.samples.append(flat[:: max(1, flat.numel() // SAMPLE)])
