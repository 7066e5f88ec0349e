"""Scan over layers: identical decoder blocks traced once, as the body of a loop.

Unrolled, the captured step holds one copy of the block per layer, so trace and compile
time grow with depth. Here the per-layer weights are stacked along a new leading dim
inside the step and the blocks run as one `scan_op` (the raw higher-order op: the public
`scan()` wraps itself in torch.compile and cannot be traced by make_fx), whose body is
one block applied to one slice of the stacked weights. The stacks are what the step
differentiates and updates: clipping and AdamW run once per stack (elementwise, so
each element computes what it computes per layer), and only the step's inputs and
outputs stay per layer, so the traced op count stops growing with depth.

The decoder's `hidden()` loops `for block in self.layers.values()`: while tracing, that
one call is pointed at a single callable that runs the whole scan. The summed auxiliary
loss rides in the loop carry, so it is added in the same order as the unrolled loop.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch._higher_order_ops.scan import scan_op

from titan_core.compile.graph_trainer.params import as_param


class ScanError(ValueError):
    """The model's decoder blocks cannot be scanned (they are not structurally identical)."""


def _block_signature(block: nn.Module) -> dict[str, object]:
    """Everything that makes two blocks compute differently, apart from weight values."""
    sig: dict[str, object] = {}
    for path, mod in block.named_modules():
        sig[f"{path}:type"] = type(mod).__name__
        for key, value in vars(mod).items():
            if not key.startswith("_") and isinstance(value, (int, float, bool, str, type(None))):
                sig[f"{path}.{key}"] = value
        for name, buf in mod.named_buffers(recurse=False):
            sig[f"{path}.{name}:buffer"] = tuple(buf.shape)
    for name, p in block.named_parameters():
        sig[f"{name}:param"] = (tuple(p.shape), p.dtype)
    return sig


def check_scannable(model: nn.Module) -> list[str]:
    """Raise ScanError unless every block matches block 0; return the block's parameter names."""
    blocks = list(model.layers.items())
    if len(blocks) < 2:
        raise ScanError("scan_layers needs at least 2 decoder blocks")
    first_name, first = blocks[0]
    ref = _block_signature(first)
    if any(k.endswith(":buffer") for k in ref):
        raise ScanError("scan_layers does not stack block buffers; the blocks hold buffers")
    for name, block in blocks[1:]:
        sig = _block_signature(block)
        if sig != ref:
            diff = sorted(k for k in ref.keys() | sig.keys() if ref.get(k) != sig.get(k))
            k = diff[0]
            raise ScanError(
                f"layer {name} differs from layer {first_name} at {k}: {sig.get(k)!r} vs {ref.get(k)!r}; "
                "scan_layers needs structurally identical decoder blocks (a local/global or dense/MoE "
                "layer pattern is not; run it unrolled)"
            )
    return [n for n, _ in first.named_parameters()]


def scan_blocks(
    template: nn.Module, stacked: list[torch.Tensor], names: list[str], h, cos, sin, segment_ids, wrap=None
):
    """Run `template` once per leading slice of the stacked weights; returns (h, summed aux).

    `wrap(j, slice)` turns the j-th weight slice into what the block reads (e.g. a DTensor).
    """
    n = len(names)
    extra = [cos, sin] + ([segment_ids] if segment_ids is not None else [])

    def body(h, aux, *rest):
        weights, (c, s, *seg) = rest[:n], rest[n:]
        if wrap is not None:
            weights = [wrap(j, w) for j, w in enumerate(weights)]
        out, layer_aux = torch.func.functional_call(
            template, dict(zip(names, weights)), (h, c, s, seg[0] if seg else None)
        )
        return [out, aux + layer_aux]

    h, aux = scan_op(body, [h, h.new_zeros((), dtype=torch.float32)], stacked, extra)
    return h, aux


@dataclass(frozen=True)
class Stacking:
    """Which flat parameters stack into which per-name tensor under scan_layers."""

    block_names: list[str]
    """Parameter names inside a block, e.g. `attention.wq.weight`."""
    index: list[list[int]]
    """index[j][l]: flat position of block parameter j of layer l."""
    others: list[int]
    """Flat positions of the parameters outside the blocks (embedding, final norm, head)."""


def plan_stacking(model: nn.Module, param_names: list[str], group_of: list[int]) -> Stacking:
    """Check the blocks can be scanned and map each block parameter name to its layers' positions."""
    block_names = check_scannable(model)
    pos = {name: i for i, name in enumerate(param_names)}
    index = [[pos[f"layers.{k}.{bn}"] for k in model.layers] for bn in block_names]
    for bn, row in zip(block_names, index):
        if len({group_of[i] for i in row}) != 1:
            raise ScanError(
                f"{bn} sits in different optimizer param groups across layers; scan updates it as one stack"
            )
    stacked = {i for row in index for i in row}
    return Stacking(block_names, index, [i for i in range(len(param_names)) if i not in stacked])


@contextlib.contextmanager
def scanned_layers(model: nn.Module, stacked: list[torch.Tensor], block_names: list[str], block_specs: list):
    """Within the context, `model.hidden()` runs all blocks as one scan over the `stacked` weights.

    `stacked[j]` is block parameter j of every layer along dim 0 (local shards under
    SimpleFSDP); `block_specs[j]` (None when plain) rebuilds each slice as the DTensor the
    block reads.
    """
    wrap = (lambda j, w: as_param(w, block_specs[j])) if any(block_specs) else None
    template = next(iter(model.layers.values()))

    def run_all(h, cos, sin, segment_ids):
        return scan_blocks(template, stacked, block_names, h, cos, sin, segment_ids, wrap)

    # hidden() iterates self.layers.values(); one "block" that is the whole scan takes their place
    model.layers.values = lambda: [run_all]
    try:
        yield
    finally:
        del model.layers.values
