"""A weight stream (titan_core/weights/hf_stream.py) driven as an inference engine's `load_weights` takes it,
counted by TensorPeak: what the stream itself holds beyond the model's shards.

The consumer pauses (SETTLE_S) after each tensor, as an engine copying it to its device would. Without the
pause the count also held gloo's lag, not the stream's: gloo drops its reference to a finished all-gather's
output on its worker thread, which may run only after the consumer has gone on. Measured on
the [lora] FSDP2 world (2 ranks, 40 streams each, three CPU burners beside them): the peak varied between
1.5x, 2x and (once in the suite) 2.2x the largest tensor without the pause, each extra being an earlier
gather's output still alive at the next gather; with a 20 ms pause it was 1.5x in all 80 (the gathered
tensor and the shard it was summed into).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from titan_core.memory.tensor_peak import TensorPeak

SETTLE_S = 0.02


def stream_peak(stream: Iterable[tuple[str, torch.Tensor]],
                take: Callable[[str, torch.Tensor], None] = lambda name, t: None) -> dict:  # fmt: skip
    """Each (name, tensor) given to `take`, nothing kept: the most tensor bytes alive at once, the largest
    tensor, the total and the names in order."""
    names, largest, total = [], 0, 0
    with TensorPeak() as peak, torch.no_grad():
        for name, tensor in stream:
            take(name, tensor)
            names.append(name)
            largest, total = max(largest, tensor.nbytes), total + tensor.nbytes
            del tensor
            time.sleep(SETTLE_S)
    return {"peak_bytes": peak.peak_bytes, "largest_bytes": largest, "total_bytes": total, "names": names}
