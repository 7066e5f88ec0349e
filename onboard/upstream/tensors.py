"""The upstream model's state tensors, as its checkpoint holds them.

Every parameter and every persistent buffer of a model (built on the meta device by the caller:
no memory), each with the module that holds it and its name with the decoder-layer index folded
out, `model.layers.{i}.self_attn.sinks`, so a tensor every layer has is one entry with the list
of its layers. Non-persistent buffers (RoPE's `inv_freq`) are left out: no checkpoint carries
them, so no adapter maps them. A parameter held by a plain torch module (an nn.Linear) is
reported with the nearest module above it that upstream wrote itself (`DeepseekV3MLP` for
`mlp.shared_experts.gate_proj.weight`): that class is where its computation is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

LAYER_INDEX = re.compile(r"^(?P<pre>(?:.*?\.)?layers\.)(?P<i>\d+)\.(?P<rest>.+)$")
"""The first `layers.<N>.` of a name: the decoder-layer index (non-greedy, so an inner list of
a layer, e.g. its experts, is not taken for the layer list)."""
INNER_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")
"""Any other index in a name (a per-expert ModuleList): folded as `{j}`."""


@dataclass(frozen=True)
class StateTensor:
    """One tensor of a state dict and where it lives."""

    key: str
    """Its name in the state dict, e.g. `model.layers.0.self_attn.sinks`."""
    tensor: torch.Tensor
    buffer: bool
    """A persistent buffer (True) or a parameter (False)."""
    module: str
    """Path of the module that holds it directly (`model.layers.0.self_attn`)."""
    owner: str
    """Path of the nearest module at or above `module` whose class is not torch.nn's own."""
    owner_type: type
    """That module's class (`GptOssAttention`): its code is where the tensor's computation is read."""

    @property
    def owner_class(self) -> str:
        """The owner's class name, e.g. `GptOssAttention`."""
        return self.owner_type.__name__

    @property
    def leaf(self) -> str:
        """The attribute name on its module (`sinks`, `weight`, `e_score_correction_bias`)."""
        return self.key.rpartition(".")[2]


def fold(key: str) -> tuple[str, int | None, str]:
    """(name with the layer index as `{i}` and inner indices as `{j}`, the layer index or None
    outside the decoder layers, the name after `layers.<i>.` or the whole name outside them)."""
    m = LAYER_INDEX.match(key)
    if m is None:
        return INNER_INDEX.sub("{j}", key), None, key
    return f"{m['pre']}{{i}}.{INNER_INDEX.sub('{j}', m['rest'])}", int(m["i"]), m["rest"]


def _owner(modules: dict[str, nn.Module], path: str) -> str:
    # torch.nn's own classes (Linear, Embedding, ModuleList) say nothing of what upstream computes
    while path and type(modules[path]).__module__.startswith("torch."):
        path = path.rpartition(".")[0]
    return path


def state_tensors(model: nn.Module) -> list[StateTensor]:
    """Every parameter (a tied one once, under its first name) and every persistent buffer of `model`."""
    modules = dict(model.named_modules(remove_duplicate=False))
    out = []

    def add(key: str, tensor: torch.Tensor, buffer: bool) -> None:
        module = key.rpartition(".")[0]
        owner = _owner(modules, module)
        out.append(StateTensor(key, tensor, buffer, module, owner, type(modules[owner])))

    for key, p in model.named_parameters():
        add(key, p, False)
    for path, mod in model.named_modules():
        for name, b in mod.named_buffers(recurse=False):
            if name not in mod._non_persistent_buffers_set:
                add(f"{path}.{name}" if path else name, b, True)
    return out
