"""Graph passes over the captured step: the contract, the default pipeline and the cleanup passes.

A pass is a function `(gm, example_inputs, *, settings) -> gm`: it may rewrite `gm` in
place or return a new module, reads everything it needs from the node tags and
`settings`, and keeps `node.meta["val"]` (a fake tensor) on every node it adds so later
passes can reason about shapes and bytes. Passes are registered under a name
(`register_pass`, in registry.py) and sit in one of two tiers:

- numerics-preserving (run by default): the step still computes bit for bit what eager
  computes; the 3-step `torch.equal` test runs with all of them on;
- numerics-changing (only with `--graph_trainer.numerics_changing`): faster or leaner,
  but not bit-identical; whoever turns one on must check its effect on the numbers.

`--graph_trainer.disable_passes=a,b` drops passes by name; `--graph_trainer.debug_passes`
prints the op counts before and after each pass.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch.fx import GraphModule

# importing memory_policy registers its passes (it imports the registry, never this module)
from titan_core.compile.graph_trainer import memory_policy  # noqa: F401
from titan_core.compile.graph_trainer.registry import GraphPass, PassSettings, meta_like, passes_by_name, register_pass
from titan_core.config.loader import ConfigError, did_you_mean

aten = torch.ops.aten


@dataclass
class PassRecord:
    """What one pass did: op counts before and after, and its run time."""

    name: str
    nodes_before: int
    nodes_after: int
    changed_ops: dict[str, tuple[int, int]]
    """op -> (count before, count after), only for ops whose count changed."""
    seconds: float


#: numerics-preserving passes, in order (a name may appear twice)
DEFAULT_PIPELINE = (
    "view_to_reshape", "remove_detach", "dce", "tag_memory_policy", "apply_recompute", "apply_offload", "dce",
)  # fmt: skip
#: appended when numerics-changing passes are allowed
NUMERICS_CHANGING_PIPELINE = ("matmul_bf16",)


def registered_passes() -> dict[str, GraphPass]:
    """Every registered pass by name: this module's and memory_policy.py's."""
    return passes_by_name()


def build_pipeline(*, disable=(), numerics_changing: bool = False) -> list[GraphPass]:
    """The default pipeline minus `disable`; plus the numerics-changing tier when asked."""
    passes = passes_by_name()
    for name in disable:
        if name not in passes:
            raise ConfigError(
                f"unknown graph pass '{name}' in graph_trainer.disable_passes{did_you_mean(name, sorted(passes))}"
            )
    names = list(DEFAULT_PIPELINE) + (list(NUMERICS_CHANGING_PIPELINE) if numerics_changing else [])
    return [passes[n] for n in names if n not in set(disable)]


def op_counts(gm: GraphModule) -> Counter:
    """How many nodes call each op (placeholders and output excluded)."""
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def run_passes(gm: GraphModule, example_inputs, passes: list[GraphPass], *, settings: PassSettings):
    """Apply `passes` in order; returns (gm, [PassRecord]). Prints op-count diffs when settings.debug."""
    records = []
    for p in passes:
        before, n_before = op_counts(gm), len(gm.graph.nodes)
        t0 = time.perf_counter()
        gm = p.fn(gm, example_inputs, settings=settings)
        if settings.debug:
            gm.graph.lint()  # name the pass that broke the graph, not a later one
        dt = time.perf_counter() - t0
        after = op_counts(gm)
        changed = {
            op: (before[op], after[op]) for op in sorted(before.keys() | after.keys()) if before[op] != after[op]
        }
        rec = PassRecord(p.name, n_before, len(gm.graph.nodes), changed, dt)
        records.append(rec)
        if settings.debug:
            print(f"[graph pass] {p.name}: {rec.nodes_before} -> {rec.nodes_after} nodes in {dt * 1e3:.1f} ms")
            for op, (b, a) in changed.items():
                print(f"    {op}: {b} -> {a}")
    gm.graph.lint()
    gm.recompile()  # once, at the end: regenerating the Python code costs more than most passes
    return gm, records


# ---- numerics-preserving cleanup ---------------------------------------------------------
@register_pass("remove_detach", description="drop detach/alias nodes (no-ops on values)")
def remove_detach(gm: GraphModule, example_inputs, *, settings: PassSettings) -> GraphModule:
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in (aten.detach.default, aten.alias.default):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    return gm


def _written_through(node: torch.fx.Node) -> bool:
    """Whether an op writes into `node`'s value, directly or through a view of it (schema alias info)."""
    for user in node.users:
        target = user.target
        schema = getattr(target, "_schema", None)
        if schema is None:
            continue
        for i, arg in enumerate(schema.arguments):
            value = user.args[i] if i < len(user.args) else user.kwargs.get(arg.name)
            if value is node and arg.alias_info is not None and arg.alias_info.is_write:
                return True
        if any(r.alias_info is not None for r in schema.returns) and _written_through(user):
            return True
    return False


@register_pass("view_to_reshape", description="view -> reshape where nothing writes through the view")
def view_to_reshape(gm: GraphModule, example_inputs, *, settings: PassSettings) -> GraphModule:
    """The capture records `view` with the strides its fake tensors had; a CPU kernel that keeps its
    input's layout (softplus_backward over a transposed tensor, in LaRA's conv mixer) returns another
    stride at run time, and `view` refuses it. `reshape` is the same view wherever the strides allow
    one and a copy of the same values elsewhere: bit-identical, unless something writes through the
    view, so such a view is kept."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten.view.default and not _written_through(node):
            node.target = aten.reshape.default
    return gm


@register_pass("dce", description="remove nodes whose values nobody uses")
def dce(gm: GraphModule, example_inputs, *, settings: PassSettings) -> GraphModule:
    gm.graph.eliminate_dead_code()
    return gm


# ---- numerics-changing ---------------------------------------------------------------------
_MATMULS = {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (1, 2)}


@register_pass(
    "matmul_bf16", numerics_changing=True, description="run fp32 matmuls of forward and backward with bf16 operands"
)
def matmul_bf16(gm: GraphModule, example_inputs, *, settings: PassSettings) -> GraphModule:
    """Cast both matrix operands of each fp32 mm/bmm/addmm in forward and backward to bf16.

    The product comes back in fp32 (bias and accumulation stay fp32); the optimizer is
    untouched. Faster where bf16 matmuls are (GPUs, TPUs); changes numerics everywhere.
    """
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _MATMULS or node.meta.get("gt_region") == "optimizer":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype != torch.float32:
            continue
        args = list(node.args)
        for i in _MATMULS[node.target]:
            with graph.inserting_before(node):
                cast = graph.call_function(aten._to_copy.default, (args[i],), {"dtype": torch.bfloat16})
            cast.meta.update(
                meta_like(args[i], dtype=torch.bfloat16),
                gt_region=node.meta.get("gt_region"),
                gt_layer=node.meta.get("gt_layer"),
            )
            args[i] = cast
        if node.target is aten.addmm.default:
            # keep the bias add in fp32: mm in bf16, then add
            with graph.inserting_before(node):
                mm = graph.call_function(aten.mm.default, (args[1], args[2]))
                up = graph.call_function(aten._to_copy.default, (mm,), {"dtype": torch.float32})
                out = graph.call_function(aten.add.Tensor, (args[0], up))
            mm.meta.update(meta_like(node, dtype=torch.bfloat16))
            for n in (up, out):
                n.meta.update(meta_like(node))
            for n in (mm, up, out):
                n.meta.update(gt_region=node.meta.get("gt_region"), gt_layer=node.meta.get("gt_layer"))
            node.replace_all_uses_with(out)
            graph.erase_node(node)
            continue
        node.args = tuple(args)
        node.meta["val"] = meta_like(node, dtype=torch.bfloat16)["val"]
        with graph.inserting_after(node):
            up = graph.call_function(aten._to_copy.default, (node,), {"dtype": torch.float32})
        node.replace_all_uses_with(up, delete_user_cb=lambda user, up=up: user is not up)
        up.meta.update(
            meta_like(node, dtype=torch.float32),
            gt_region=node.meta.get("gt_region"),
            gt_layer=node.meta.get("gt_layer"),
        )
    return gm
