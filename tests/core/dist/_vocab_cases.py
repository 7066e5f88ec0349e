"""The cases of test_vocab_parallel.py: TP = 2 with the vocabulary split, each run again in one plain process.

Each is one of _cases.py's tiny configs (vocab 256, so each TP rank holds 128 rows) trained
3 steps on the same rows: llama3 for an untied head, glimmer for a tied one (its debug flavor
ties the head and soft-caps the logits), with and without sequence parallel, with the plain
loss and with fused_ce (chunks of 24 of the 64 tokens: a chunk that ends inside a row and a
shorter last one), z-loss on in some.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _cases import SEQ_LEN, tiny_cfg

STEPS = 3
BATCH = 2
FUSED = ("--kernels.loss=fused_ce", "--kernels.ce_chunk=24")
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "untied": ("llama3", ()),
    "untied_sp": ("llama3", ("--parallelism.sequence_parallel",)),
    "tied": ("glimmer", ("--kernels.z_loss=0.001",)),
    "tied_sp": ("glimmer", ("--parallelism.sequence_parallel",)),
    "fused_untied_sp": ("llama3", (*FUSED, "--kernels.z_loss=0.001", "--parallelism.sequence_parallel")),
    "fused_tied": ("glimmer", FUSED),
}
"""name -> (family, overrides on top of the tiny config)."""
TP = ("--parallelism.data_parallel=simple_fsdp", "--parallelism.tp=2", "--parallelism.dp_shard=1")
ONE = ("--parallelism.data_parallel=none",)


def case_cfg(name: str, out: Path, *, tp: bool):
    """The case's config, on 2 TP ranks (`tp`) or in one plain process (where sequence parallel has no meaning)."""
    family, extra = CASES[name]
    if not tp:
        extra = tuple(x for x in extra if x != "--parallelism.sequence_parallel")
    return tiny_cfg(family, out / name, *extra, *(TP if tp else ONE), batch_size=BATCH, steps=STEPS)


def probe_tokens() -> torch.Tensor:
    """Tokens whose logits (`model(tokens)`, before step 1) the TP ranks and one process compare."""
    return torch.randint(0, 256, (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(7))
