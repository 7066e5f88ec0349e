"""What kind of model a family builds, and what its samples and its first loss are.

Tools around the trainer (a parity check, a kernel comparison, a planner) ask a model's args
these questions instead of checking which family it is, so a family of a new kind (a vision
encoder beside the causal LMs and FLUX) answers them in its own folder and nothing outside it
changes. `ModelArgs` (args.py) is where they are asked: `args.kind`, `args.sample_spec()`,
`args.initial_loss()`, `args.own_samples(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

UPSTREAMS = ("transformers", "diffusers")
"""The libraries whose classes a family is the port of."""


@dataclass(frozen=True, kw_only=True)
class ModelKind:
    """Facts every model of one kind shares, whatever its sizes."""

    name: str
    """A short name for messages: "causal_lm", "flow"."""
    upstream: str
    """The library whose class this kind ports (one of UPSTREAMS): its configs are that library's
    config.json, parity compares with that class, and a checkpoint of it loads through that
    library's layout. Only a "transformers" kind has the port and transformers paths (a
    ported model.py starts from a decoder family) and a checkpoint `initial_hf` reads."""
    loss_head: bool
    """The loss goes through a cross-entropy head at module path `loss_head` (TrainableModel), so the
    loss kernels (kernels.loss, fused_ce) have something to replace."""
    causal: bool
    """Attention is causal; a kernel that always masks causally (splash) computes it."""
    context_parallel: bool
    """A sample's token rows can be split over context-parallel ranks (parallelism.cp > 1): its
    token mixing is attention over one sequence with an explicit mask."""
    zero_output_at_init: bool
    """The init zeroes what the output depends on (adaLN-Zero's modulation, the output projection), so two
    computations compared at init agree whatever they compute: a comparison draws those first."""


CAUSAL_LM = ModelKind(
    name="causal_lm", upstream="transformers", loss_head=True, causal=True, context_parallel=True,
    zero_output_at_init=False,
)  # fmt: skip
"""A decoder-only language model trained on next-token cross-entropy (the shared decoder's
families, the transformers path, every port)."""


@dataclass(frozen=True, kw_only=True)
class SampleSpec:
    """What one batch of a model holds (titan_core.data.base.Batch) and how `loss` and `forward` read it."""

    tokens: str
    """What `Batch.tokens` holds, in words ("token ids [batch, seq]")."""
    inputs: tuple[str, ...] = ()
    """The named inputs `loss` takes beside tokens and labels (`Batch.inputs`); empty for text."""
    forward_inputs: tuple[str, ...] = ()
    """Of `inputs`, those `forward` takes too: the model's output at a clean sample is
    `model(tokens, **those)` (a flow model's noise is the loss's alone)."""
    packed: bool = True
    """Rows may hold packed documents: positions and segment_ids apply (and `forward` takes segment_ids)."""
    seq_len: int | None = None
    """The tokens per sample the model requires (training.seq_len must be it); None: any length."""


@dataclass(frozen=True)
class InitialLoss:
    """The loss a freshly initialised model should start near, on the samples it trains on."""

    value: float
    """The loss, in the units `loss` returns."""
    what: str
    """What the value is, in words ("ln(vocab 2048), a uniform prediction")."""
    basis: Mapping[str, float] = field(default_factory=dict)
    """The numbers it is computed from, by name ({"vocab_size": 2048, "ln_vocab": 7.62}); empty for a constant."""
