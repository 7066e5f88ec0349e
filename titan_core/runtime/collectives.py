"""An all-reduce that runs the same eagerly and under tracing (make_fx, torch.compile).

Functional collectives rather than c10d's in-place ones: the Graph Trainer's make_fx and dynamo
trace them into `_c10d_functional` nodes, where an in-place `dist.all_reduce` is either refused
or baked in. Eagerly a functional collective returns an AsyncCollectiveTensor; it is waited for
here, so callers get a plain tensor they may modify in place.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol


def all_reduce(t: torch.Tensor, op: str, group) -> torch.Tensor:
    """`t` reduced over `group` with `op` ("sum", "max", ...), as a new tensor on every rank."""
    out = funcol.all_reduce(t, op, group)
    return funcol.wait_tensor(out) if isinstance(out, funcol.AsyncCollectiveTensor) else out
