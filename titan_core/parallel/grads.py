"""Global gradient norm and clipping over plain or DTensor (sharded) gradients.

One function for every data-parallel mode, so `none` and `simple_fsdp` run the same
arithmetic. When every gradient lives on a one-rank mesh its local tensor is the whole
gradient: the norm is then taken on the local tensors, exactly as plain eager does
(DTensor's norm would go through a `Partial` square-and-root that may round differently).
On a real mesh DTensor computes the norm (counting replicated copies once) and one
all-reduce makes it global. Clipping scales the local tensors in place.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from titan_core.parallel.local import local_tensor


def total_norm(ts: list[torch.Tensor], foreach: bool = True) -> torch.Tensor:
    """L2 norm over all tensors, accumulated in fp64 where the device has it.

    In fp32 the norm of one large gradient (e.g. a 2048 x 256 output head) is ~3e-5 off
    its exact value and the rounding depends on how the tensor is split, so a sharded
    run would miss a 1e-6 comparison with eager on rounding alone. TPUs have no fp64.
    """
    if any(local_tensor(t).device.type not in ("cpu", "cuda") for t in ts):
        return torch.nn.utils.get_total_norm(ts, foreach=foreach)
    norms = [torch.linalg.vector_norm(t, 2.0, dtype=torch.float64) for t in ts]
    return torch.linalg.vector_norm(torch.stack(norms)).float()


@torch.no_grad()
def clip_grad_norm_(params: Iterable[torch.nn.Parameter], max_norm: float, foreach: bool = True) -> torch.Tensor:
    """Clip gradients to a global L2 norm of `max_norm` (<= 0: measure only); returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    locals_ = [local_tensor(g) for g in grads]
    one_rank = all(not isinstance(g, DTensor) or g.device_mesh.size() == 1 for g in grads)
    norm = total_norm(locals_ if one_rank else grads, foreach=foreach)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if max_norm > 0:
        # the same arithmetic as torch.nn.utils.clip_grads_with_norm_, on the local shards
        coef = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for t in locals_:
            by_device.setdefault(t.device, []).append(t)
        for device, ts in by_device.items():
            if foreach:
                torch._foreach_mul_(ts, coef.to(device))
            else:
                for t in ts:
                    t.mul_(coef.to(device))
    return norm
