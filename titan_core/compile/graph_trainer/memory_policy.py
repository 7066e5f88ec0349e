"""Memory policy for the captured step: tag forward nodes save / recompute / offload, then act.

In the whole-step graph an activation is a forward value that a backward node reads; it
stays alive from the forward to that read. `tag_memory_policy` marks every forward node
(`meta["gt_policy"]`), following the chosen policy:

- `default`: save the outputs of matmuls and attention, and the block boundaries
  (values passed from one decoder block to the next); recompute the rest (norms,
  activations, RoPE, casts: cheap pointwise work);
- `full`: save only the block boundaries; recompute everything else, matmuls included;
- `offload`: like `default`, but what would be saved is copied to host memory in the
  forward and brought back right before the backward reads it.

Ops that must not run twice (random, mutating, collectives, loops) are always saved, and so is
every value whose memory an op writes in place, and what reads it (`written_storages`).
Then `apply_recompute` and `apply_offload` (in that order, so recomputed values read the
reloaded copies too) rewrite the graph from the tags: a recomputed value is cloned into
the backward, right before its first backward reader, from saved values and inputs; the
forward original dies at its last forward use (FX frees values after their last use). Recomputed ops run on the same inputs as the originals, so the
step stays bit-identical. `saved_activation_bytes` measures what crosses from forward
to backward, on the device and on the host.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node
from torch.multiprocessing.reductions import StorageWeakRef

from titan_core.compile.graph_trainer.registry import PassSettings, meta_like, register_pass

aten = torch.ops.aten

POLICIES = ("default", "full", "offload")

#: outputs worth keeping under `default`: expensive to recompute
COMPUTE_HEAVY = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.convolution.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}


def _is_forward(node: Node) -> bool:
    return node.meta.get("gt_region") == "forward"


def _is_later(node: Node) -> bool:
    return node.meta.get("gt_region") in ("backward", "optimizer")


def _recomputable(node: Node) -> bool:
    """Pure, deterministic, cheap to describe: safe to run a second time."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return _recomputable(node.args[0])
    if not isinstance(target, torch._ops.OpOverload):
        return False  # higher-order ops (scan) and Python callables
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return target.namespace not in ("_c10d_functional", "c10d_functional", "_dtensor")


def _storage(node) -> StorageWeakRef | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def written_storages(gm: GraphModule) -> set[StorageWeakRef]:
    """Storages an op of the graph writes in place: transformers' MLA fills a `new_empty` key with
    a `copy_` into each slice. Such a value is not a function of its node's inputs (a recompute
    reads memory nothing wrote), and a copy taken right after its node misses the writes."""
    out = set()
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable:
            continue
        for i, spec in enumerate(target._schema.arguments):
            arg = node.args[i] if i < len(node.args) else node.kwargs.get(spec.name)
            if spec.alias_info is not None and spec.alias_info.is_write and (st := _storage(arg)) is not None:
                out.add(st)
    return out


def _touches(node: Node, written: set[StorageWeakRef]) -> bool:
    """`node` is, views or reads memory that some op writes in place."""
    return any(_storage(n) in written for n in (node, *node.all_input_nodes))


def _base_target(node: Node):
    """The op behind a node (behind getitem for multi-output ops)."""
    while node.op == "call_function" and node.target is operator.getitem:
        node = node.args[0]
    return node.target


def block_boundaries(gm: GraphModule) -> set[Node]:
    """Forward values that flow between blocks: a block's outputs and what enters a block from outside."""
    out = set()
    for node in gm.graph.nodes:
        if not _is_forward(node):
            continue
        layer = node.meta.get("gt_layer")
        for user in node.users:
            if not _is_forward(user):
                continue
            ulayer = user.meta.get("gt_layer")
            if ulayer != layer and (layer is not None or ulayer is not None):
                out.add(node)
    return out


@register_pass("tag_memory_policy", description="tag forward nodes save / recompute / offload")
def tag_memory_policy(gm: GraphModule, example_inputs, *, settings: PassSettings) -> GraphModule:
    policy = settings.memory_policy
    if policy not in POLICIES:
        raise ValueError(f"unknown memory policy '{policy}' ({' | '.join(POLICIES)})")
    boundaries, written = block_boundaries(gm), written_storages(gm)
    keep = "offload" if policy == "offload" else "save"
    for node in gm.graph.nodes:
        if not _is_forward(node):
            continue
        if not _recomputable(node) or _touches(node, written):
            tag = "save"
        elif node in boundaries:
            tag = keep
        elif _base_target(node) in COMPUTE_HEAVY:
            tag = "recompute" if policy == "full" else keep
        else:
            tag = "recompute"
        node.meta["gt_policy"] = tag
    return gm


@register_pass("apply_offload", description="copy offload-tagged activations to host and back before the backward")
def apply_offload(gm: GraphModule, example_inputs, *, settings: PassSettings) -> GraphModule:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.meta.get("gt_policy") != "offload":
            continue
        later = [u for u in node.users if _is_later(u)]
        val = node.meta.get("val")
        if not later or not isinstance(val, torch.Tensor):
            continue
        with graph.inserting_after(node):
            host = graph.call_function(
                aten._to_copy.default, (node,), {"device": torch.device("cpu"), "non_blocking": True}
            )
        host.meta.update(
            meta_like(node, device=torch.device("cpu")),
            gt_region="forward",
            gt_layer=node.meta.get("gt_layer"),
            gt_offloaded=True,
        )
        first = min(later, key=_position(graph))
        with graph.inserting_before(first):
            back = graph.call_function(aten._to_copy.default, (host,), {"device": val.device, "non_blocking": True})
        back.meta.update(meta_like(node), gt_region=first.meta["gt_region"], gt_layer=None, gt_reloaded=True)
        for user in later:
            user.replace_input_with(node, back)
        node.meta["gt_policy"] = "save"  # what stays on the device is only its forward life
    return gm


def _position(graph):
    pos = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: pos[n]


@register_pass("apply_recompute", description="clone recompute-tagged forward values into the backward")
def apply_recompute(gm: GraphModule, example_inputs, *, settings: PassSettings) -> GraphModule:
    graph = gm.graph
    clones: dict[Node, Node] = {}

    def materialize(n: Node, before: Node) -> Node:
        if n in clones:
            return clones[n]
        if not isinstance(n, Node) or not _is_forward(n) or n.meta.get("gt_policy") != "recompute":
            return n
        with graph.inserting_before(before):
            new = graph.node_copy(n, lambda a: materialize(a, before))
        new.meta = dict(n.meta, gt_region=before.meta["gt_region"], gt_recomputed=True)
        clones[n] = new
        return new

    for node in list(graph.nodes):
        if not _is_later(node) or node.meta.get("gt_recomputed"):
            continue
        for arg in list(node.all_input_nodes):
            if _is_forward(arg) and arg.meta.get("gt_policy") == "recompute":
                node.replace_input_with(arg, materialize(arg, node))
    return gm


@dataclass(frozen=True)
class ActivationBytes:
    device: int
    """Bytes of forward values read by the backward that stay in device memory."""
    host: int
    """Bytes of activations parked in host memory (offload policy)."""
    count: int
    """How many distinct tensors cross from forward to backward."""


def saved_activation_bytes(gm: GraphModule) -> ActivationBytes:
    """Measure what crosses from the forward to the backward in `gm` (views of one storage count once)."""
    # views of inputs (a transposed weight, a reshaped batch) hold no memory of their own
    inputs = {_storage(n) for n in gm.graph.nodes if n.op == "placeholder"} - {None}
    device, host, seen = 0, 0, set()
    for node in gm.graph.nodes:
        if not _is_forward(node) or node.op == "placeholder":
            continue
        if not any(_is_later(u) for u in node.users):
            continue
        key = _storage(node)
        if key is None or key in seen or key in inputs:
            continue
        seen.add(key)
        nbytes = node.meta["val"].untyped_storage().nbytes()
        if node.meta.get("gt_offloaded"):
            host += nbytes
        else:
            device += nbytes
    return ActivationBytes(device=device, host=host, count=len(seen))
