"""Parameter counts and training FLOPs per token, derived from the module tree."""

from __future__ import annotations

import torch

from titan_core.models.common.args import TransformerArgs
from titan_core.models.common.decoder import Transformer
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.protocol import TrainableModel


def param_counts(args: TransformerArgs) -> dict[str, int]:
    """{total, active, embedding}: active counts only top_k of each layer's routed experts
    (`param_counts.count_params`, on the shared decoder built on meta)."""
    with torch.device("meta"):
        model = Transformer(args)
    total, active = count_params(model)
    return {"total": total, "active": active, "embedding": model.tok_embeddings.weight.numel()}


def flops_per_token(args: TransformerArgs, seq_len: int, *, lora_params: int = -1) -> float:
    """Forward + backward FLOPs per token: 6 per matmul weight, plus attention scores.

    Embedding lookups are not matmuls, so an untied embedding is excluded while a tied one
    still pays for the output head. Attention counts the full seq x seq score and value
    matmuls (12 * layers * heads * head_dim * seq per token), which is what dense kernels
    execute even under a causal or windowed mask. With `lora_params` >= 0 ([lora]: the base
    frozen) a weight's own gradient (2 of its 6) is never computed, its input's still is, and the
    adapters' `lora_params` cost 6 each as any trained weight does.
    """
    counts = param_counts(args)
    attn = 12 * args.n_layers * args.n_heads * args.head_dim * seq_len
    weights = weight_flops(counts["active"], counts["embedding"], tied=args.tie_embeddings)
    if lora_params >= 0:
        weights = weights * 2 / 3 + 6.0 * lora_params
    return weights + attn


def weight_flops(active: int, embedding: int, *, tied: bool) -> float:
    """Forward + backward FLOPs per token of the weights: 6 per active parameter a token multiplies by;
    an untied input embedding of `embedding` parameters is a lookup, a tied one is the output head too."""
    return 6.0 * (active - (0 if tied else embedding))


def model_flops_per_token(model: TrainableModel, seq_len: int, *, lora_params: int = -1) -> float:
    """Training FLOPs per token of a built model: its own count where it has one (flux: per image
    token; the transformers path's attention-free stacks), else `flops_per_token` of its args, with
    `lora_params` (an own count knows its layers, not which of them are frozen: it is kept)."""
    own = model.flops_per_token(seq_len)
    return flops_per_token(model.args, seq_len, lora_params=lora_params) if own is None else own
