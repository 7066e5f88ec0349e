"""FSDP2 (`torch.distributed.fsdp.fully_shard`): the hook-based, eager-oriented alternative.

One FSDP unit per block, one for an untied token embedding, and the root (the final norm, the
output head, and anything else). The trainer
calls `model.loss(...)`, not `forward`, so `loss` is registered as a forward method:
without it the root's parameters would never be gathered before use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from titan_core.parallel.simple_fsdp import MixedPrecision

if TYPE_CHECKING:
    from titan_core.models.common.protocol import TrainableModel


def fsdp2_policy(model: nn.Module, mp: MixedPrecision) -> MixedPrecisionPolicy:
    """FSDP2's mixed precision for `model`'s units: a cast only where `mp` asks for another dtype than
    the stored one (a cast to the same dtype would still copy)."""
    stored = next(model.parameters()).dtype
    return MixedPrecisionPolicy(
        param_dtype=None if mp.param_dtype == stored else mp.param_dtype,
        reduce_dtype=None if mp.reduce_dtype == mp.param_dtype else mp.reduce_dtype,
    )


def apply_fsdp2(
    model: TrainableModel, dp_mesh: DeviceMesh, mp: MixedPrecision, keep_stored: frozenset[str] = frozenset()
) -> TrainableModel:
    """Shard `model` over `dp_mesh` (1-D: fully shard; 2-D replicate x shard: HSDP). The modules that
    own a parameter of `keep_stored` become units of their own that cast nothing (FSDP2's policy is
    per unit): their parameters are gathered and reduced in their stored dtype."""
    policy = fsdp2_policy(model, mp)
    for owner in sorted({name.rpartition(".")[0] for name in keep_stored}):
        fully_shard(model.get_submodule(owner), mesh=dp_mesh, mp_policy=MixedPrecisionPolicy())
    # an untied embedding is a unit of its own: gathered for its lookup and freed after it, its gradient
    # reduced at the end of the backward, not held gathered with the root's head through the step. The
    # head stays the root's: the loss reads its weight without calling it (no forward for FSDP2 to hook)
    embedding = getattr(model, "tok_embeddings", None)
    if getattr(model, "output", None) is not None and isinstance(embedding, nn.Module):
        names = {f"tok_embeddings.{n}" for n, _ in embedding.named_parameters()}
        if names and not names & keep_stored:  # an owner of a kept parameter is a unit already
            fully_shard(embedding, mesh=dp_mesh, mp_policy=policy)
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    register_fsdp_forward_method(model, "loss")
    return model

