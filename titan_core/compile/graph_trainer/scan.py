"""Scan over layers: identical decoder blocks traced once, as the body of a loop.

Unrolled, the captured step holds one copy of the block per layer, so trace and compile
time grow with depth. Here the per-layer weights are stacked along a new leading dim
inside the step and the blocks run as one `scan_op` (the raw higher-order op: the public
`scan()` wraps itself in torch.compile and cannot be traced by make_fx), whose body is
one block applied to one slice of the stacked weights. The stacks are what the step
differentiates and updates: clipping and AdamW run once per stack (elementwise, so
each element computes what it computes per layer), and only the step's inputs and
outputs stay per layer, so the traced op count stops growing with depth.

Two block loops are scanned. The native decoder's `hidden()` loops `for block in
self.layers.values()`: while tracing, that one call is pointed at a single callable that
runs the whole scan; each layer's auxiliary output (a MoE layer's routing statistics) leaves
the loop stacked and is summed after it in layer order, as the unrolled loop adds it. A
model whose blocks sit in an `nn.ModuleList` that its own forward iterates (the
transformers path: `LlamaModel.forward` loops over `self.layers[:n]`) has that list's
contents replaced, while tracing, by one module that
runs the scan with whatever keywords the loop passes (masks, rotary tables, positions:
their tensors enter the scan as loop-invariant inputs). transformers' blocks hold their
index (`layer_idx`) for the KV cache; that is no structural difference when the index is
read only for the cache (checked on the classes' source), since the model runs without one.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
from dataclasses import dataclass

import torch
from torch import nn
from torch._higher_order_ops.scan import scan_op
from torch.utils._pytree import tree_flatten, tree_unflatten

from titan_core.compile.graph_trainer.params import as_param
from titan_core.config.loader import ConfigError


class ScanError(ConfigError):
    """The model's decoder blocks cannot be scanned (they are not structurally identical); exit 2."""


@functools.cache
def _index_only_for_cache(cls: type) -> bool:
    """True when no method of `cls` (or its non-torch bases) reads `self.layer_idx` outside
    `__init__` except on a line about the KV cache; False when unsure (no source)."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch.") or klass is object:
            continue
        try:
            src = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            return False
        lines = src.splitlines()
        init = set()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                init.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        for i, line in enumerate(lines, 1):
            low = line.lower()
            if "self.layer_idx" in line and i not in init and "cache" not in low and "past_key" not in low:
                return False
    return True


def _block_signature(block: nn.Module) -> dict[str, object]:
    """Everything that makes two blocks compute differently, apart from weight values."""
    sig: dict[str, object] = {}
    for path, mod in block.named_modules():
        sig[f"{path}:type"] = type(mod).__name__
        for key, value in vars(mod).items():
            if key == "layer_idx" and _index_only_for_cache(type(mod)):
                continue
            if not key.startswith("_") and isinstance(value, (int, float, bool, str, type(None))):
                sig[f"{path}.{key}"] = value
        for name, buf in mod.named_buffers(recurse=False):
            sig[f"{path}.{name}:buffer"] = tuple(buf.shape)
    for name, p in block.named_parameters():
        sig[f"{name}:param"] = (tuple(p.shape), p.dtype)
    return sig


def check_scannable(model: nn.Module) -> list[str]:
    """Raise ScanError unless every block matches block 0 and the model's block loop can be
    taken over (see the module docstring); return the block's parameter names."""
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
    _runner_site(model)
    return [n for n, _ in first.named_parameters()]


def scan_blocks(
    template: nn.Module, stacked: list[torch.Tensor], names: list[str], h, cos, sin, segment_ids, wrap=None
):
    """Run `template` once per leading slice of the stacked weights; returns (h, summed aux).

    `wrap(j, slice)` turns the j-th weight slice into what the block reads (e.g. a DTensor).
    """
    n = len(names)
    extra = [cos, sin] + ([segment_ids] if segment_ids is not None else [])

    def body(h, *rest):
        weights, (c, s, *seg) = rest[:n], rest[n:]
        if wrap is not None:
            weights = [wrap(j, w) for j, w in enumerate(weights)]
        out, layer_aux = torch.func.functional_call(
            template, dict(zip(names, weights)), (h, c, s, seg[0] if seg else None)
        )
        return [out, layer_aux]

    # each layer's aux (a MoE layer's routing statistics, of a shape only the block knows) is a
    # per-layer output, summed after the loop in layer order as the unrolled loop sums it
    h, per_layer = scan_op(body, [h], stacked, extra)
    aux = h.new_zeros((), dtype=torch.float32)
    for layer_aux in per_layer.unbind(0):
        aux = aux + layer_aux
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


def _block_paths(model: nn.Module) -> list[str]:
    """Each block's module path from the model root (`layers.0`; `model.layers.0` on the transformers path)."""
    paths = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    blocks = list(model.layers.values())
    missing = [k for k, b in zip(model.layers, blocks) if id(b) not in paths]
    if missing:
        raise ScanError(
            f"decoder block {missing[0]} is not a submodule of the model; scan_layers cannot find its weights"
        )
    return [paths[id(b)] for b in blocks]


def plan_stacking(model: nn.Module, param_names: list[str], group_of: list[int], hypers: list) -> Stacking:
    """Check the blocks can be scanned and map each block parameter name to its layers' positions.

    A stack is updated with its first layer's group's step scalars: its layers may sit in different groups
    (titan_core's AdamW has a group pair per block) only where those groups' constants are equal; their
    learning rates are the recipe's under one schedule, and they step together."""
    block_names = check_scannable(model)
    pos = {name: i for i, name in enumerate(param_names)}
    index = [[pos[f"{path}.{bn}"] for path in _block_paths(model)] for bn in block_names]
    for bn, row in zip(block_names, index):
        if len({hypers[group_of[i]] for i in row}) != 1:
            raise ScanError(
                f"{bn} sits in optimizer param groups of different hyperparameters across layers; scan updates it "
                "as one stack"
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
    site = _runner_site(model)
    if site is None:

        def run_all(h, cos, sin, segment_ids):
            return scan_blocks(template, stacked, block_names, h, cos, sin, segment_ids, wrap)

        # hidden() iterates self.layers.values(); one "block" that is the whole scan takes their place
        model.layers.values = lambda: [run_all]
        try:
            yield
        finally:
            del model.layers.values
        return
    # the model's forward iterates this ModuleList: it holds one module, the whole scan, meanwhile
    saved = site._modules
    site._modules = {"0": _ScanRunner(template, stacked, block_names, wrap)}
    try:
        yield
    finally:
        site._modules = saved


def _runner_site(model: nn.Module) -> nn.ModuleList | None:
    """None for the native decoder (`model.layers` is its own child, iterated by `hidden()`);
    else the ModuleList that holds exactly the blocks, in order, which the model's forward iterates."""
    if model._modules.get("layers") is model.layers:
        return None
    paths = _block_paths(model)
    parent = paths[0].rpartition(".")[0]
    site = model.get_submodule(parent) if parent else model
    blocks = list(model.layers.values())
    if not isinstance(site, nn.ModuleList) or list(site) != blocks:
        raise ScanError(
            f"scan_layers needs the decoder blocks in one nn.ModuleList the model iterates; `{parent}` is a "
            f"{type(site).__name__} holding {len(site._modules)} modules for {len(blocks)} blocks"
        )
    return site


class _ScanRunner(nn.Module):
    """Stands in for every block of a ModuleList loop: called like one block (hidden states
    first, the loop's keywords after), it runs all of them as one scan. Attributes the loop
    reads off a block (e.g. `attention_type`) are the template's: scan checked they agree."""

    def __init__(self, template: nn.Module, stacked, names: list[str], wrap):
        super().__init__()
        # plain attributes, not children: the runner owns no parameters of its own
        object.__setattr__(self, "_scan", (template, stacked, names, wrap))

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_scan")[0], name)

    def forward(self, hidden_states, *args, **kwargs):
        template, stacked, names, wrap = self._scan
        leaves, spec = tree_flatten((args, kwargs))
        is_tensor = [isinstance(x, torch.Tensor) for x in leaves]
        n = len(names)

        def body(h, *rest):
            weights, tensors = rest[:n], iter(rest[n:])
            if wrap is not None:
                weights = [wrap(j, w) for j, w in enumerate(weights)]
            a, kw = tree_unflatten([next(tensors) if t else x for x, t in zip(leaves, is_tensor)], spec)
            out = torch.func.functional_call(template, dict(zip(names, weights)), (h, *a), kw)
            if not isinstance(out, torch.Tensor):
                raise ScanError(
                    f"scan_layers: {type(template).__name__} returns a {type(out).__name__}, not the hidden states"
                )
            return [out]

        (h,) = scan_op(body, [hidden_states], stacked, [x for x, t in zip(leaves, is_tensor) if t])
        return h
