"""The transformers path where a layer's attention is more than causal: a mask the module makes of
its own (Doge), the keys a sparse-attention indexer chooses (DeepSeek-V3.2, Qwen4-Exp), key blocks
no core reads (MiniMax-M3), keys beside the sequence under the module's own mask (DeepSeek-V4).
Each runs in the naive core, equal to transformers' own class, and every other core refuses it."""

from __future__ import annotations

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

from titan_core.models.common.swaps import apply_swaps
from titan_core.kernels.attention import KernelUnavailable
from titan_core.models.common.attention import NaiveAttention

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from transformers_models import SMALL, ours, same_logits, theirs, tokens  # noqa: E402


def test_a_mask_the_attention_module_computes_is_a_score_bias_only_the_naive_core_adds():
    # Doge's attention builds a mask from its own parameters (A, dt_proj) and hands it to the
    # interface: it is part of the model, so the naive core adds it and the others refuse it
    config = transformers.DogeConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2, keep_window_size=8)
    model = ours(config)
    assert [type(c) for c in model.attention_cores()] == [NaiveAttention, NaiveAttention]
    with torch.no_grad():
        for layer in model.layers.values():
            layer.self_attn.A.normal_()  # transformers inits it at 0, a mask every key shares
    ref = theirs(model, config)
    assert same_logits(model, ref) < 1e-5  # keep_window_size 8 of 24 keys: the top keys of the causal ones
    full = tokens(25)
    model.train()
    model.loss(full[:, :-1], full[:, 1:])[1].backward()
    grads = {n: p.grad for n, p in model.named_parameters() if n.endswith(("self_attn.A", "dt_proj.weight"))}
    assert len(grads) == 4 and all(g is not None and g.abs().sum() > 0 for g in grads.values())
    apply_swaps(model, ["attention.sdpa"])
    with pytest.raises(KernelUnavailable, match="passes `position_bias`.*kernels.attention=naive"):
        model.loss(full[:, :-1], full[:, 1:])


def test_a_block_that_gets_transformers_masks_compiles_without_a_break():
    # the model marks a module that makes its own mask when it builds it: nothing in the attention
    # call looks a class's source up, which dynamo cannot trace (a break in every compiled block)
    from titan_core.compile.per_block import explain_blocks, graph_breaks_total
    from titan_core.data.base import Batch

    config = transformers.DogeConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2, keep_window_size=8)
    model = ours(config)
    toks = tokens(17)
    report = explain_blocks(model, Batch(toks[:, :-1], toks[:, 1:]))
    assert report and graph_breaks_total(report) == 0, report


@pytest.mark.parametrize("model_type", ["deepseek_v32", "qwen4_exp_text"])
def test_the_keys_a_sparse_attention_indexer_chooses_are_the_keys_attended(model_type):
    # DeepSeek-V3.2 hands its indexer's top keys to a sparse kernel as `indices` (the eager path
    # folds them into the mask instead); Qwen4-Exp narrows the mask itself. The tiny config keeps 32
    # keys of the 64 here: a core that masked causally alone would attend to all of them
    from onboard.compat.tiny import tiny_config

    cfg = tiny_config(model_type)
    config = transformers.AutoConfig.for_model(**cfg)
    model = ours(config)
    assert {type(c) for c in model.attention_cores()} == {NaiveAttention}
    toks = tokens(64)
    ref = theirs(model, config)
    assert same_logits(model, ref, toks) < 1e-5
    # the selection changes what attention computes at this length: keeping every key differs
    budget = next(k for k in ("index_topk", "indexer_budget") if k in cfg)
    wide = transformers.AutoConfig.for_model(**{**cfg, budget: 64})
    assert same_logits(model, theirs(model, wide), toks) > 1e-3
    # mixed precision reads the dtypes of the class built once more: the masks stay built after it
    assert model.params_kept_fp32(torch.bfloat16) is not None and model.hf.config._attn_implementation == "titan_masked"
    assert same_logits(model, ref, toks) < 1e-5
    apply_swaps(model, ["attention.sdpa"])
    with pytest.raises(KernelUnavailable, match="passes `position_bias`.*kernels.attention=naive"):
        model.loss(toks[:, :-1], toks[:, 1:])


def test_a_selection_of_key_blocks_no_core_reads_is_refused_not_dropped():
    # MiniMax-M3's sparse layers hand their indexer's chosen key blocks as `block_indices` (the
    # class's default makes every layer full attention; a released config sets which are sparse)
    from onboard.compat.tiny import tiny_config
    from titan_core.kernels.attention import KernelRefusesModel

    cfg = {**tiny_config("minimax_m3_vl_text"), "layer_types": ["minimax_m3_sparse", "full_attention"]}
    model = ours(transformers.AutoConfig.for_model(**cfg))
    with pytest.raises(KernelRefusesModel, match="`block_indices`.*the selection would be lost"):
        model.loss(tokens(), tokens())


def test_keys_beside_the_sequence_run_under_the_modules_own_mask_in_the_naive_core_only():
    # DeepSeek-V4's attention puts compressed entries beside the sequence's keys and extends its mask
    # over them: that mask, not positions, says which key each query sees
    from onboard.compat.tiny import tiny_config
    from titan_core.kernels.attention import KernelRefusesModel

    config = transformers.AutoConfig.for_model(**tiny_config("deepseek_v4"))
    model = ours(config)
    assert {type(c) for c in model.attention_cores()} == {NaiveAttention}
    assert same_logits(model, theirs(model, config), tokens(64)) < 1e-5
    # packed documents are told apart by position, which the compressed entries have none of
    toks = tokens(64)
    documents = (torch.arange(64) >= 32).long().expand(2, 64)
    with pytest.raises(KernelRefusesModel, match=r"in packed documents \(segment_ids\), which its own mask"):
        model.loss(toks, toks, segment_ids=documents)
    apply_swaps(model, ["attention.sdpa"])  # its sinks and its mask: only the naive core adds them
    with pytest.raises(KernelRefusesModel, match="passes `(s_aux|position_bias)`.*kernels.attention=naive"):
        model.loss(tokens(), tokens())


def test_keys_beside_the_sequence_with_no_mask_over_them_are_refused_with_the_reason():
    from titan_core.kernels.attention import KernelRefusesModel
    from titan_core.models.transformers.hf_attention import call_core

    class Memory(torch.nn.Module):  # keys of a memory the module holds, and no mask of its own
        is_causal = True

    q, kv = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 12, 16)
    with pytest.raises(KernelRefusesModel, match=r"attends 12 keys from 8 queries .* with no mask of its own"):
        call_core(NaiveAttention(), Memory(), q, kv, kv)
