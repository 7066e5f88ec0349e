"""The local shard of a possibly sharded tensor: the one helper every DTensor-aware caller shares."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (the tensor itself otherwise)."""
    return t.to_local() if isinstance(t, DTensor) else t
