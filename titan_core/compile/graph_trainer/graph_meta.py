"""Node metadata for passes that add nodes to a traced graph."""

from __future__ import annotations

import torch


def meta_like(node, *, dtype=None, device=None) -> dict:
    """meta['val'] for a node computing a tensor like `node`'s, with another dtype or device."""
    val = node.meta["val"]
    with val.fake_mode:
        new = torch.empty_strided(val.shape, val.stride(), dtype=dtype or val.dtype, device=device or val.device)
    return {"val": new}
