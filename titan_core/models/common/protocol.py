"""What a model offers the trainer, the parallel plans, the execution modes and the swaps.

`TrainableModel` names every member titan_core (and any caller driving a model through it)
reads from a model: its args, its blocks, its loss head, what it says about itself (notes,
swap paths and refusals), its FLOP count, its init and its mixed-precision wishes. Every
family (the shared decoder, flux), the transformers path and every port (a `module_file`'s
model) subclass `ModelBase`, which gives the members that have a natural default; the rest
each of them writes itself. Code that drives a model reads these members directly:
nothing probes a model with getattr/hasattr for them (tests/core/unit/test_model_protocol.py
greps for it).

`check_trainable(model, where)` is the check `model_builder.build_meta_model` runs on every
model it builds, so a port that lacks a member is refused there, naming the member, instead
of training with a silent fallback.

Not `typing.runtime_checkable`: from Python 3.12 `isinstance` against a protocol looks its
members up with `inspect.getattr_static`, which does not see an nn.Module's registered
children (`layers` and `loss_head` live in `_modules`), so it would call the shared decoder
incomplete. `missing_members` uses ordinary attribute access instead.
"""

from __future__ import annotations

from collections import abc
from types import MappingProxyType
from typing import Mapping, Protocol, Sequence

import torch
from torch import nn

from titan_core.config.loader import ConfigError
from titan_core.models.common.args import ModelArgs


class TrainableModel(Protocol):
    """The members of a model that titan_core reads (module docstring). Each has a default in
    `ModelBase` unless its docstring says the model must define it."""

    args: ModelArgs
    """The architecture the model was built from (model_builder passes it to the constructor):
    MoE counts (n_experts, top_k) and tie_embeddings are read from here, and what the model is:
    its kind (`args.kind`: upstream, loss head, causal attention, context parallel), its samples
    (`args.sample_spec()`, `args.own_samples(...)`) and its first loss (`args.initial_loss()`),
    models/common/kind.py. Must be set."""
    layers: nn.ModuleDict
    """The blocks, {"0": block, "1": ..., } in execution order: FSDP2 units, tensor-parallel
    plans, per-block compile, the Graph Trainer's block tags and the memory estimate go by
    them. Must be defined; a model whose blocks live elsewhere (the transformers path) gives a
    view over them. Empty only for a model with no repeated block."""
    loss_head: nn.Module | None
    """The module `loss` hands (hidden states, output weight, labels) to, at module path
    `loss_head` (kernels.loss swaps it; per-block compile compiles it). None (the default) for a
    model whose loss has no such head (flux's flow-matching MSE)."""
    notes: Sequence[str]
    """Lines saying what of the model runs otherwise than through titan_core's kernels (the
    transformers path's own attention modules, its stacks); a run records them. Empty (the
    default) for a model that runs wholly on titan_core's layers."""
    swap_paths: Mapping[str, str | tuple[str, ...]]
    """{native swap pattern (`layers.*.attention.core`): the pattern or patterns of this model's
    own tree where that module lives}, for a model whose module paths are not the native
    decoder's (the transformers path). Empty (the default): the native patterns apply as they are."""
    swap_refusals: Mapping[str, str]
    """{native swap pattern: why a kernel swap there is refused}, added to the refusal's message
    (the transformers path's experts it cannot compute through titan_core). Empty by default."""

    def forward(self, tokens: torch.Tensor, **inputs) -> torch.Tensor:
        """Logits [batch, seq, vocab] (flux: the predicted velocity). Must be defined."""
        ...

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor, *, positions=None, segment_ids=None, **inputs):
        """(training loss, cross-entropy): the trainer's entry point, with any auxiliary term
        (MoE load balancing) in the first only. Must be defined."""
        ...

    def init_weights(self, seed: int | None = None) -> None:
        """Initialise every parameter and non-persistent buffer in place (after `to_empty`), as
        upstream's init does; parity's init check compares the two. Must be defined."""
        ...

    def flops_per_token(self, seq_len: int) -> float | None:
        """Training FLOPs (forward + backward) per token at `seq_len` (MFU), when the model counts
        its own (flux: per image token). None (the default): the shared decoder's estimate of
        `args` applies; `stats.model_flops_per_token(model, seq_len)` gives the number either way."""
        ...

    def params_kept_fp32(self, dtype: torch.dtype) -> frozenset[str]:
        """Parameter names mixed precision of param dtype `dtype` must leave in fp32 (their
        code computes in fp32). Default: none."""
        ...

    def buffers_follow(self, dtype: torch.dtype) -> list[str]:
        """Cast the buffers the model's own code expects in the compute dtype `dtype` to it;
        return their names (parallelize calls it). Default: none, nothing cast."""
        ...


MEMBERS: tuple[str, ...] = (
    *TrainableModel.__annotations__,
    *(name for name, value in vars(TrainableModel).items() if callable(value) and not name.startswith("_")),
)
"""Every member of `TrainableModel`, in one place: the check below and the test that keeps
getattr/hasattr probes of them out of the code both read this."""


class ModelBase(nn.Module):
    """The defaults of `TrainableModel` (each member's docstring says which has one). A
    subclass calls `super().__init__()` first, sets `args` and `layers`, and writes `forward`,
    `loss` and `init_weights`; it overrides a default by assigning or defining the member."""

    notes: Sequence[str] = ()
    swap_paths: Mapping[str, str | tuple[str, ...]] = MappingProxyType({})
    swap_refusals: Mapping[str, str] = MappingProxyType({})

    def __init__(self) -> None:
        super().__init__()
        # an instance attribute, not a class one: a class-level None would hide the head a
        # subclass registers later (nn.Module keeps children in _modules, found only after the class)
        self.loss_head: nn.Module | None = None

    def flops_per_token(self, seq_len: int) -> float | None:
        # not the decoder estimate itself: computing it builds the shared decoder, which subclasses this
        return None

    def params_kept_fp32(self, dtype: torch.dtype) -> frozenset[str]:
        return frozenset()

    def buffers_follow(self, dtype: torch.dtype) -> list[str]:
        return []


_KINDS = {
    "args": (ModelArgs, "ModelArgs"),
    "layers": (nn.ModuleDict, "an nn.ModuleDict of the blocks"),
    "loss_head": ((nn.Module, type(None)), "an nn.Module or None"),
    "notes": ((list, tuple), "a list of lines"),
    "swap_paths": (abc.Mapping, "a mapping"),
    "swap_refusals": (abc.Mapping, "a mapping"),
}
"""The kind each data member must hold: (isinstance's classes, how the refusal names it)."""


def missing_members(model: nn.Module) -> list[str]:
    """What `model` lacks of `TrainableModel`, or holds as the wrong kind, a phrase each
    (empty: it offers every member)."""
    out = []
    for name in MEMBERS:
        if not hasattr(model, name):  # the one place a model is probed: to say what it lacks
            out.append(f"`{name}`")
        elif name == "forward" and type(model).forward is nn.Module.forward:
            out.append("`forward` (nn.Module's placeholder)")
        elif name in _KINDS:
            kind, want = _KINDS[name]
            value = getattr(model, name)
            if not isinstance(value, kind):
                out.append(f"`{name}` as {want} (it is a {type(value).__name__})")
        elif not callable(getattr(model, name)):
            out.append(f"`{name}` as a method")
    return out


def check_trainable(model: nn.Module, where: str) -> None:
    """ConfigError naming what `model` (built from `where`: a module file, a family) lacks of
    `TrainableModel`; nothing when it offers every member."""
    missing = missing_members(model)
    if missing:
        raise ConfigError(
            f"{where}: the model it builds ({type(model).__name__}) lacks {', '.join(missing)} of what titan_core "
            "trains through (TrainableModel, titan_core/models/common/protocol.py); subclass "
            "titan_core.models.common.protocol.ModelBase for the defaults and define the rest"
        )
