"""A [lora] run's weights for an inference engine, one full tensor at a time (the weight stream of
titan_core/weights/hf_stream.py):

- `merged=True`: the model as `merge_and_unload` would leave it, under the HF names of the full model:
  every base weight, an adapted one plus its adapter's delta (peft's own `get_delta_weight`, B @ A
  times alpha / rank, added as peft's merge adds it), a saved module's trained copy in place of the
  original. What the merged export writes, tensor for tensor, without a merged copy of the model. On
  several ranks the delta is computed on the adapters' shards, sharded as its weight, added shard to
  shard, and only the sum is gathered: beyond its shards a rank holds one full weight at a time (and the
  copy its HF name takes); measured at 2 ranks: 1.5x the largest weight (tests/core/dist/test_lora_two_ranks.py).
- `merged=False`: the adapter alone, under the keys of the PEFT export (export.py), for an engine that
  applies LoRA adapters itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import torch
from torch import nn

from titan_core.lora.export import adapter_plan
from titan_core.lora.inject import ADAPTER, LoraState, base_state_dict
from titan_core.parallel.simple_fsdp import stored_reads
from titan_core.weights.hf_stream import StreamPlan, stream_plan


def lora_weights(model: nn.Module, state: LoraState, adapter, *, merged: bool, dst: int | None = None,
                 device: torch.device | str | None = "cpu") -> Iterator[tuple[str, torch.Tensor]]:  # fmt: skip
    """`(name, full tensor)` one at a time (module docstring); `dst` and `device` as `hf_weights`'.
    Collective under a process group: every rank drives the whole iteration."""
    return (merged_plan(model, state, adapter) if merged else adapter_plan(model, state)).weights(dst=dst, device=device)


def merged_plan(model: nn.Module, state: LoraState, adapter) -> StreamPlan:
    """The stream of the merged model: the base under its native names, each saved module's trained copy
    in the original's place, each adapted weight with its delta added once gathered."""
    from peft.utils.other import ModulesToSaveWrapper  # lazy: the [hf] extra

    tensors = base_state_dict(model)
    for name, module in model.named_modules():
        if isinstance(module, ModulesToSaveWrapper):  # the trained copy, under the original's names
            for key, t in module.modules_to_save[ADAPTER].state_dict(keep_vars=True).items():
                tensors[f"{name}.{key}"] = t
    layers = dict(model.named_modules())
    deltas = {f"{native}.weight": partial(_sharded_delta, layers[native]) for native in state.names.targets}
    return stream_plan(model, adapter, tensors=tensors, deltas=deltas)


def _sharded_delta(layer: nn.Module) -> torch.Tensor:
    """peft's delta of `layer`, computed on the adapters' shards where they are sharded (SimpleFSDP's stored
    shards, not its gathers; FSDP2's are shards outside its forward): a delta sharded as its weight, which
    the stream adds shard to shard and gathers once, so no rank holds a full delta beside the full weight."""
    with torch.no_grad(), stored_reads(layer):
        return layer.get_delta_weight(ADAPTER)
