"""The two sides every transformers-path test compares: the path's model of a config (`ours`) and
transformers' own class loaded with its weights (`theirs`), with the tokens and the logits' distance."""

from __future__ import annotations

import torch

from titan_core.measure.numerics import rel_l2
from titan_core.models.registry import build_meta

SMALL = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=256,
             max_position_embeddings=256)  # fmt: skip


def ours(config):
    """The transformers path's model of `config`, as the trainer builds it (meta, materialised, seeded)."""
    from titan_core.models.transformers import ADAPTER

    args, _ = ADAPTER.args_from_hf(config.to_dict())
    model = build_meta("transformers", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model


def theirs(model, config):
    """transformers' own class of what `model` runs, eager attention, loaded with `model`'s weights."""
    from titan_core.models.transformers.hf_classes import causal_lm_parts

    cls, cfg = causal_lm_parts(config)
    ref = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    assert ref.load_state_dict(model.state_dict(), strict=True)
    return ref.eval()


def tokens(n: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(seed))


def same_logits(model, ref, toks=None) -> float:
    toks = tokens() if toks is None else toks
    model.eval()
    with torch.no_grad():
        return rel_l2(model(toks), ref(input_ids=toks, use_cache=False).logits)
