"""Loggers held at ERROR for the length of a block: for libraries whose import warns of things
that do not concern a run (kernel libraries for hardware this machine does not have)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

TORCHAO_IMPORT = ("torchao", "torch.utils._pytree")
"""torchao's import tries its CUDA kernel libraries (mxfp8, CUTLASS sm90a) and warns for each on a
CPU-only torch, and registers enums torch now warns about; float8 training uses neither."""


@contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
