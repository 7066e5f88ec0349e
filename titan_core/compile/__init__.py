"""Execution modes beyond eager: per-block torch.compile and the Graph Trainer.

Public API for callers that run and measure them:

- per-block compile: `apply_per_block_compile`, `explain_blocks` (graph breaks and their
  reasons per block), `graph_breaks_total`, `dynamo_compile_seconds`;
- Graph Trainer (`titan_core.compile.graph_trainer`): `GraphTrainStep` (its `.stats`:
  captures, programs per step, trace / pass / compile time, host syncs),
  `measure_memory_policies`, `find_host_syncs`, `graphs_per_step`, `host_sync_nodes`,
  `saved_activation_bytes`; a trainer's step is `Trainer.graph_step`.
"""

# ruff: noqa: F401  (the package re-exports its modules' public names)

from titan_core.compile.per_block import (
    BlockBreaks,
    apply_per_block_compile,
    compiled_modules,
    dynamo_compile_seconds,
    explain_blocks,
    graph_breaks_total,
)
