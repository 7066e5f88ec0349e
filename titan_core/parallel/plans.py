"""Tensor-parallel plans per model family: which linear is split by columns, which by rows.

Megatron-style for a decoder block: q/k/v and the MLP's w1/w3 are column-wise (each TP
rank computes some heads / some hidden units from the replicated input), `wo` and `w2`
are row-wise (each rank's partial output is summed by an all-reduce). Norms stay
replicated over TP (they are still sharded by SimpleFSDP).

Outside the blocks the vocabulary is split (vocab_parallel.py): the token embedding by
rows (RowwiseParallel: each rank looks up its slice, the all-reduce sums the ranks'
lookups) and the output head's weight by the same rows (ColwiseParallel; the decoder only
reads the head's weight, which the loss head then uses on its slice); a tied weight is both,
split once. The vocabulary size must be divisible by tp. The final norm's output is handed
on as a DTensor on the tp mesh, so the loss head (and `forward`'s logits, gathered whole at
the model's output) know how it is laid out.

Sequence parallel (`parallelism.sequence_parallel`) additionally splits the residual
stream over the sequence between the TP regions: norms run on each rank's chunk of
positions, the attention / MLP input is all-gathered over the sequence, and the row-wise
outputs are reduce-scattered instead of all-reduced (same bytes, 1/tp the activations).
The embedding's sum over ranks is a reduce-scatter into chunks, and the loss head
all-gathers the final norm's chunks (its gradient reduce-scattered back).

An MoE decoder's plan splits the attention and leaves the MoE layers whole on every tp rank
(MOE_DECODER); their experts are split by expert parallelism, not by tp. A family without an entry
has no plan, and `parallelism.tp > 1` is refused for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

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
    outside: Callable[[bool], dict[str, ParallelStyle]]
    """Styles for modules outside the blocks (path from the model root), given sequence_parallel;
    a path whose module is None (the head of a tied model) is left out."""
    sp_partial_grad: tuple[str, ...]
    """Sequence parallel: parameter paths (block-relative, or model-level with a leading '/') applied
    to a rank's chunk of positions, whose grads sum over TP."""
    optional: tuple[str, ...] = ()
    """Block children some blocks do not have (an MoE layer has no `feed_forward`): the styles and
    quantities under them apply to the blocks that have them."""
    no_sequence_parallel: str = ""
    """Why this plan refuses sequence parallel ("": it takes it)."""

    def block_styles(self, sequence_parallel: bool) -> dict[str, Callable[[], ParallelStyle]]:
        """The styles applied inside each block: `block`, with `sp_block` over it under sequence parallel
        (also what [lora] reads to split an adapter as the layer it adapts: titan_core/lora/tensor_parallel.py)."""
        return {**self.block, **self.sp_block} if sequence_parallel else dict(self.block)


class EmbeddingRowwise(RowwiseParallel):
    """RowwiseParallel whose sum over ranks is waited for before the embedding's output leaves it.

    RowwiseParallel's own is asynchronous: the first block then gets an AsyncCollectiveTensor, and a
    per-block compiled block hands its gradient back as a plain tensor, which the collective's
    backward cannot take (torch 2.13, compile.enable with tp > 1). Waiting here costs nothing: the
    first block's norm needs the sum at once.
    """

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        if outputs.placements != output_layouts:
            outputs = outputs.redistribute(placements=output_layouts)
        return outputs.to_local() if use_local_output else outputs


def _vocab_split(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The embedding and head split by vocabulary, the final norm's output as a DTensor (module docstring)."""
    residual = Shard(1) if sequence_parallel else Replicate()
    return {
        "tok_embeddings": EmbeddingRowwise(input_layouts=Replicate(), output_layouts=residual),
        "output": ColwiseParallel(),  # never called: the decoder reads `output.weight` only
        "norm": PrepareModuleOutput(output_layouts=residual, desired_output_layouts=residual, use_local_output=False),
    }


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
    outside=_vocab_split,
    sp_partial_grad=("attention_norm.weight", "ffn_norm.weight", "/norm.weight"),
)

MOE_DECODER = replace(
    DENSE_DECODER,
    optional=("feed_forward",),
    no_sequence_parallel=(
        "the MoE layers run whole (replicated over tp) on the whole sequence; a sequence-split residual would "
        "route each tp rank's positions alone"
    ),
)
"""An MoE decoder: attention (and any dense MLP layer) split as DENSE_DECODER; the MoE layers, router and
experts, replicated over tp: every tp rank routes the same tokens, its experts split by expert
parallelism (ep carved from dp_shard x cp) or whole, so their gradients need no sum over tp."""

TP_PLANS: dict[str, TPPlan] = {"llama3": DENSE_DECODER, "qwen3": DENSE_DECODER, "glimmer": DENSE_DECODER,
                               "qwen3_moe": MOE_DECODER}  # fmt: skip
