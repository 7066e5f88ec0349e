"""A full-size checkpoint checked against the native model without loading a byte of it.

The check itself is titan_core's (titan_core/weights/header_check.py: names, shapes and dtypes
from the safetensors headers alone, mapped through the adapter on meta), so the load of
`checkpoint.initial_hf` refuses exactly what this check names. Here the weights folder is found
as parity finds it (`onboard.upstream.hf_model.weight_files`: UpstreamError, bad input, for a
folder that holds no checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from onboard.upstream.hf_model import weight_files
from titan_core.weights.header_check import HeaderReport, check_headers


def check_checkpoint_headers(
    weights_dir: str | Path, meta_model: nn.Module, adapter: Any, *, dtype: str | torch.dtype | None = None
) -> HeaderReport:
    """Check every tensor of the checkpoint in `weights_dir` against `meta_model` through
    `adapter` (anything with `from_hf(sd)`: a family's HFAdapter, a workspace's ADAPTER or
    module). Reads headers only. UpstreamError (bad input) for a folder holding no checkpoint."""
    weights_dir = Path(weights_dir)
    return check_headers(weights_dir, weight_files(weights_dir), meta_model, adapter, dtype=dtype)
