"""Tensor-parallel plans per model family: which linear is split by columns, which by rows.

Megatron-style for a decoder block: q/k/v and the MLP's w1/w3 are column-wise (each TP
rank computes some heads / some hidden units from the replicated input), `wo` and `w2`
are row-wise (each rank's partial output is summed by an all-reduce). Embeddings, norms
and the output head stay replicated over TP (they are still sharded by SimpleFSDP).

Sequence parallel (`parallelism.sequence_parallel`) additionally splits the residual
stream over the sequence between the TP regions: norms run on each rank's chunk of
positions, the attention / MLP input is all-gathered over the sequence, and the row-wise
outputs are reduce-scattered instead of all-reduced (same bytes, 1/tp the activations).
The embedding output is cut into chunks and the final norm's output gathered back, so
the loss head sees whole sequences.

A family without an entry has no plan, and `parallelism.tp > 1` is refused for it:
qwen3_moe's experts would need expert parallelism or a per-expert split, not this plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
)


@dataclass(frozen=True)
class TPPlan:
    block: dict[str, Callable[[], ParallelStyle]]
    """Module path inside each block (`model.layers.<i>`) -> the style that splits it."""
    local_counts: dict[str, tuple[str, ...]]
    """Module path inside a block -> integer attributes that count per-rank units (heads)."""
    partial_grad: tuple[str, ...]
    """Parameter paths inside a block applied to TP-local activations: their grads sum over TP."""
    divisible: dict[str, str]
    """Quantity the TP degree must divide -> `module_path.attribute` inside a block."""
    sp_block: dict[str, Callable[[], ParallelStyle]]
    """Sequence parallel: styles added to (or replacing those of) `block`."""
    sp_model: dict[str, Callable[[], ParallelStyle]]
    """Sequence parallel: styles for modules outside the blocks (path from the model root)."""
    sp_partial_grad: tuple[str, ...]
    """Sequence parallel: parameter paths (block-relative, or model-level with a leading '/') applied
    to a rank's chunk of positions, whose grads sum over TP."""


DENSE_DECODER = TPPlan(
    block={
        "attention.wq": ColwiseParallel,
        "attention.wk": ColwiseParallel,
        "attention.wv": ColwiseParallel,
        "attention.wo": RowwiseParallel,
        "feed_forward.w1": ColwiseParallel,
        "feed_forward.w3": ColwiseParallel,
        "feed_forward.w2": RowwiseParallel,
    },
    # the attention module reshapes q/k/v with its head counts, so they become per-rank counts
    local_counts={"attention": ("n_heads", "n_kv_heads")},
    partial_grad=("attention.q_norm.weight", "attention.k_norm.weight"),
    divisible={
        "query heads": "attention.n_heads",
        "key/value heads": "attention.n_kv_heads",
        "MLP hidden width": "feed_forward.w1.out_features",
    },
    sp_block={
        # Block.forward calls attention(x, cos, sin, segment_ids) and feed_forward(h): only x / h are split
        "attention": lambda: PrepareModuleInput(
            input_layouts=(Shard(1), None, None, None), desired_input_layouts=(Replicate(), None, None, None)
        ),
        "attention.wo": lambda: RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward": lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w2": lambda: RowwiseParallel(output_layouts=Shard(1)),
    },
    sp_model={
        "tok_embeddings": lambda: PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
        "norm": lambda: PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate()),
    },
    sp_partial_grad=("attention_norm.weight", "ffn_norm.weight", "/norm.weight"),
)

TP_PLANS: dict[str, TPPlan] = {"llama3": DENSE_DECODER, "qwen3": DENSE_DECODER, "glimmer": DENSE_DECODER}
