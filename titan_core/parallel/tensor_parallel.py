"""Apply a family's TP plan (plans.py) to every block of a materialised model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleOutput, parallelize_module

from titan_core.config.loader import ConfigError
from titan_core.parallel.plans import TP_PLANS, TPPlan
from titan_core.parallel.vocab_parallel import VocabParallelLoss

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel


def plan_for(family: str) -> TPPlan:
    """The family's TP plan; a ConfigError naming the family when it has none."""
    if family not in TP_PLANS:
        raise ConfigError(
            f"tensor parallel has no plan for family '{family}' (plans exist for {', '.join(sorted(TP_PLANS))}); "
            "set parallelism.tp = 1"
        )
    return TP_PLANS[family]


def _lookup(block: nn.Module, dotted: str, where: str):
    obj = block
    for part in dotted.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"tensor parallel plan: {where} has no '{dotted}' (the plan does not fit this model)")
        obj = getattr(obj, part)
    return obj


def apply_tensor_parallel(
    model: TrainableModel, family: str, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False
) -> frozenset[str]:
    """Split each block's linears, the embedding and the output head over `tp_mesh` (the loss head
    then runs on the vocabulary slices); returns the fqns whose grads are partial over TP.

    Each rank keeps its own slice of the (identically initialised) weights: no communication.
    """
    plan = plan_for(family)
    tp = tp_mesh.size()
    vocab = model.args.vocab_size
    if vocab % tp:
        raise ConfigError(
            f"tensor parallel splits the embedding and output head by vocabulary: tp ({tp}) does not divide the "
            f"model's vocab_size ({vocab}); choose a tp that divides it"
        )
    block_plan = plan.block_styles(sequence_parallel)
    block_partial = plan.partial_grad + (
        tuple(p for p in plan.sp_partial_grad if not p.startswith("/")) if sequence_parallel else ()
    )
    partial: set[str] = set()
    for idx, block in model.layers.items():
        where = f"layers.{idx}"
        absent = tuple(c for c in plan.optional if getattr(block, c, None) is None)

        def applies(dotted: str, absent=absent) -> bool:
            return not any(dotted == c or dotted.startswith(f"{c}.") for c in absent)

        for quantity, dotted in plan.divisible.items():
            if not applies(dotted):
                continue
            n = _lookup(block, dotted, where)
            if n % tp:
                raise ConfigError(f"tensor parallel: tp ({tp}) does not divide the {quantity} of {where} ({n})")
        styles = {path: style for path, style in block_plan.items() if applies(path)}
        for path in styles:
            _lookup(block, path, where)
        parallelize_module(block, tp_mesh, {path: style() for path, style in styles.items()}, src_data_rank=None)
        for path, attrs in plan.local_counts.items():
            module = _lookup(block, path, where)
            for attr in attrs:
                setattr(module, attr, getattr(module, attr) // tp)
        partial.update(f"{where}.{p}" for p in block_partial if _param_exists(block, p))
    outside = plan.outside(sequence_parallel)
    outside = {path: style for path, style in outside.items() if _lookup(model, path, "the model") is not None}
    parallelize_module(model, tp_mesh, outside, src_data_rank=None)
    model.loss_head = VocabParallelLoss(model.loss_head)
    # `forward`'s logits come out split like the head (or as DTensor propagates them): whole at the output
    whole_logits = PrepareModuleOutput(output_layouts=Shard(-1), desired_output_layouts=Replicate())
    parallelize_module(model, tp_mesh, whole_logits)
    if sequence_parallel:
        partial.update(p[1:] for p in plan.sp_partial_grad if p.startswith("/") and _param_exists(model, p[1:]))
    return frozenset(partial)


def _param_exists(root: nn.Module, dotted: str) -> bool:
    owner, _, leaf = dotted.rpartition(".")
    module = root.get_submodule(owner) if _has(root, owner) else None
    return module is not None and getattr(module, leaf, None) is not None


def _has(block: nn.Module, path: str) -> bool:
    try:
        return block.get_submodule(path) is not None
    except AttributeError:
        return False
