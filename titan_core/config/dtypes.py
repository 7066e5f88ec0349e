"""The recipe's dtype names (`training.dtype`, `training.mixed_precision_param` / `_reduce`) as torch dtypes.

The one map from a name a recipe or a command line gives to the torch dtype; kept out of
sections.py so that reading a recipe does not load torch.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""Every dtype name a recipe accepts (sections.py's Literal fields list the same two)."""


def compute_dtype(training) -> torch.dtype:
    """The dtype a recipe's products compute in (`training.dtype`, or the gathered params'
    `mixed_precision_param`): it decides which kernels can run (e.g. grouped_mm) and how the CPU multiplies
    (titan_core/runtime/cpu_bf16.py)."""
    bf16 = "bfloat16" in (training.dtype, training.mixed_precision_param)
    return torch.bfloat16 if bf16 else torch.float32
