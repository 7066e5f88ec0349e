"""The comparisons of the parity rung: state-dict round trip, logits, loss, gradients.

Relative errors are titan_core.measure.numerics' (one zero-reference rule for parity, kernels and tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from titan_core.measure.numerics import grad_noise, grad_rel_l2


LIST_CAP = 40  # keep results readable when everything is missing


def cap(items: list) -> list:
    return items if len(items) <= LIST_CAP else items[:LIST_CAP] + [f"... {len(items) - LIST_CAP} more"]


@dataclass
class RoundTrip:
    same_keys: bool
    max_abs_diff: float
    """Over keys present on both sides; inf when a shape differs or no key is shared."""
    missing: list[str] = field(default_factory=list)
    """Checkpoint keys that did not come back."""
    extra: list[str] = field(default_factory=list)
    """Keys that came back but are not in the checkpoint."""
    worst_key: str | None = None

    def record(self, load) -> dict[str, Any]:
        """results.json's `state_dict`: what the round trip and the load (a LoadReport) left out."""
        return {"missing_after_round_trip": cap(self.missing), "extra_after_round_trip": cap(self.extra),
                "worst_key": self.worst_key, "native_not_loaded": cap(load.missing),
                "converted_not_in_native": cap(load.unexpected),
                "shape_mismatch": cap(load.shape_mismatch)}  # fmt: skip


def _exact_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """0 only when bit-equal; otherwise the float64 max abs difference (inf for shape or NaN mismatches)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return math.inf
    if torch.equal(a, b):
        return 0.0
    diff = (b.double() - a.double()).abs().max().item()
    return diff if diff > 0 else math.inf  # unequal yet no finite difference: NaNs in different places


def round_trip(checkpoint: dict[str, torch.Tensor], back: dict[str, torch.Tensor]) -> RoundTrip:
    """Compare the HF checkpoint with HF -> native -> HF; exactness is the point, so no tolerance."""
    missing = sorted(set(checkpoint) - set(back))
    extra = sorted(set(back) - set(checkpoint))
    diffs = {key: _exact_diff(checkpoint[key], back[key]) for key in sorted(set(checkpoint) & set(back))}
    worst_key = max(diffs, key=diffs.get) if diffs else None
    worst_key = worst_key if worst_key and diffs[worst_key] > 0 else None  # name a key only when one differs
    return RoundTrip(not missing and not extra, max(diffs.values()) if diffs else math.inf, missing, extra, worst_key)


@dataclass
class GradReport:
    max_rel_l2: float
    worst_param: str | None
    per_param: dict[str, float]
    missing: list[str] = field(default_factory=list)
    """Upstream parameters with no native gradient mapped to them."""
    extra: list[str] = field(default_factory=list)
    """Mapped native gradients with no upstream parameter."""
    mapped: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    """The native gradients under HF names (for a diagnosis of where one differs)."""

    def record(self) -> dict[str, Any]:
        """results.json's `grads`: the five worst, and the parameters with no counterpart."""
        worst = sorted(self.per_param.items(), key=lambda kv: -kv[1])[:5]
        return {"worst": [{"param": k, "rel_l2": v} for k, v in worst],
                "upstream_without_native_grad": cap(self.missing),
                "native_without_upstream_param": cap(self.extra)}  # fmt: skip


def compare_grads(
    upstream: torch.nn.Module,
    native: torch.nn.Module,
    to_hf: Callable[[dict[str, Any]], dict[str, torch.Tensor]],
    *,
    tokens: int = 1,
) -> GradReport:
    """Per-parameter rel. L2 of the native gradients (mapped to HF names by the adapter) vs upstream.

    A parameter without a gradient counts as a zero gradient on that side: an expert that
    received no token has none in either model, which is agreement, not an error. A non-zero
    upstream gradient that both sides compute at or below the fp32 rounding level of the whole
    gradient over `tokens` tokens (`grad_noise`) is agreement too: it is zero in exact arithmetic
    (a key bias softmax cancels) and each side's value is its own rounding.
    """
    # every name of a tied tensor (lm_head.weight and the embedding) on both sides, so a tie is
    # compared under each name whatever the adapter does with a deduplicated dict
    native_grads = {
        n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
        for n, p in native.named_parameters(remove_duplicate=False)
    }
    mapped = to_hf(native_grads)
    hf_grads = {
        n: (p.grad if p.grad is not None else torch.zeros_like(p))
        for n, p in upstream.named_parameters(remove_duplicate=False)
    }
    per_param = {}
    noise = grad_noise(hf_grads.values(), tokens)
    for name in sorted(set(hf_grads) & set(mapped)):
        ours, theirs = mapped[name], hf_grads[name]
        per_param[name] = math.inf if ours.shape != theirs.shape else grad_rel_l2(ours, theirs, noise)
    missing = sorted(set(hf_grads) - set(mapped))
    extra = sorted(set(mapped) - set(hf_grads))
    for name in missing + extra:
        per_param[name] = math.inf
    worst = max(per_param, key=per_param.get) if per_param else None
    return GradReport(per_param[worst] if worst else math.inf, worst, per_param, missing, extra, mapped)
