"""The transformers path on stacks that are not one attention layer repeated under `model.layers`:
hybrids (Mamba beside attention), attention computed inline, layer lists kept elsewhere (an
encoder used as a decoder, the decoder half of an encoder-decoder), composite configs (the text
model of a multimodal config), a head with a bias or a transform before it, attention sinks.

Each is checked the one way that proves it: the same weights in transformers' own class (eager
attention, fp32) give the same logits, and the same loss and gradients where the head changed.
"""

from __future__ import annotations

import math

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

from titan_core.config.sections import Kernels
from titan_core.models.common.swaps import apply_swaps
from titan_core.kernels import swaps_for
from titan_core.kernels.attention import KernelUnavailable
from titan_core.models.common.attention import NaiveAttention, SDPAttention
from titan_core.measure.numerics import rel_l2

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from transformers_models import SMALL, ours, same_logits, theirs, tokens  # noqa: E402


def test_a_head_bias_reaches_the_loss_and_fused_ce():
    config = transformers.PhiConfig(**SMALL, num_hidden_layers=2, resid_pdrop=0.0, embd_pdrop=0.0)
    model = ours(config)
    assert model.head_bias
    with torch.no_grad():
        model.lm_head.bias.normal_()  # transformers inits it at 0, where dropping it would not show
    same_head(model, config, "bias")  # fused_ce too: the bias is a weight column to it


def same_head(model, config, param: str) -> None:
    """The loss, the head parameter's gradient and the logits of `model` equal transformers' own, and
    fused_ce's loss equals the plain head's: what the head does is in the operands both heads get."""
    ref = theirs(model, config)
    assert same_logits(model, ref) < 1e-6
    full = tokens(33)
    _, ce = model.loss(full[:, :-1], full[:, 1:])
    want = ref(input_ids=full, labels=full, use_cache=False).loss
    assert abs(ce.item() - want.item()) <= 1e-6 * want.item()
    ce.backward()
    want.backward()
    assert rel_l2(getattr(model.lm_head, param).grad, getattr(ref.lm_head, param).grad) < 1e-5
    apply_swaps(model, swaps_for(Kernels(loss="fused_ce")))
    _, fused = model.loss(full[:, :-1], full[:, 1:])
    assert abs(fused.item() - ce.item()) <= 1e-6 * ce.item()


def test_a_hybrid_runs_kernels_in_its_attention_layers_and_the_others_as_written():
    # layer 1 attends, layer 0 is a Mamba mixer
    config = transformers.JambaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2, attn_layer_period=2,
                                      attn_layer_offset=1, expert_layer_period=4, num_experts=2,
                                      use_mamba_kernels=False)  # fmt: skip
    model = ours(config)
    assert model.attention_sites.paths == {1: ["self_attn"]} and list(model.attention_sites.own) == [0]
    assert len(model.notes) == 1 and "layers 0 (JambaMambaDecoderLayer" in model.notes[0]
    assert [type(c) for c in model.attention_cores()] == [SDPAttention]
    ref = theirs(model, config)
    assert same_logits(model, ref) < 1e-5
    # kernels.attention lands on the attention layer only
    swapped = apply_swaps(model, ["attention.naive"])
    assert list(swapped) == ["model.layers.1.self_attn.core"]
    assert same_logits(model, ref) < 1e-5



@pytest.mark.parametrize("make", [
    lambda: transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=8,
                                     use_mambapy=False, use_cache=False),
    lambda: transformers.RwkvConfig(hidden_size=64, num_hidden_layers=2, vocab_size=256, context_length=64,
                                    attention_hidden_size=64, intermediate_size=128),
], ids=["mamba", "rwkv"])  # fmt: skip
def test_a_stack_with_no_attention_runs_as_written_and_counts_its_own_flops(make):
    config = make()
    model = ours(config)
    assert model.attention_free and model.args.n_heads == 1 and model.args.head_dim == 64  # a placeholder
    assert not model.attention_sites.paths and list(model.attention_sites.own) == [0, 1]
    assert len(model.notes) == 1 and "kernels.attention does not apply" in model.notes[0]
    ref = theirs(model, config)
    assert same_logits(model, ref) < 1e-5
    # 6 per weight a token multiplies by: every parameter but the untied input embedding
    embedding = model.hf.get_input_embeddings().weight
    weights = sum(p.numel() for p in model.parameters()) - (0 if embedding is model.output_weight else embedding.numel())
    assert model.flops_per_token(32) == 6.0 * weights
    full = tokens(33)
    _, ce = model.loss(full[:, :-1], full[:, 1:])
    ce.backward()
    assert math.isfinite(ce.item()) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_states_kept_in_fp32_reach_a_head_of_the_compute_dtype_cast_as_the_class_casts_them():
    # Mamba keeps its residual stream in fp32 (residual_in_fp32): under bf16 mixed precision its final
    # states meet a bf16 head, and MambaForCausalLM casts them to the head's dtype first
    config = transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=256, state_size=8,
                                      use_mambapy=False, use_cache=False)  # fmt: skip
    model = ours(config)
    ref = theirs(model, config).to(torch.bfloat16)
    model = model.to(torch.bfloat16)
    full = tokens(33)
    _, ce = model.loss(full[:, :-1], full[:, 1:])
    want = ref(input_ids=full, labels=full, use_cache=False).loss
    assert abs(ce.item() - want.item()) <= 1e-2 * want.item()


def test_a_logit_soft_cap_under_another_name_is_applied_by_the_head():
    # xLSTM calls it output_logit_soft_cap (30): without it the logits of trained weights run free
    from onboard.compat.tiny import tiny_config

    config = transformers.AutoConfig.for_model(**tiny_config("xlstm"))
    model = ours(config)
    assert model.final_softcap == 30.0
    with torch.no_grad():
        model.output_weight.mul_(200.0)  # logits well past the cap, where dropping it would show
    assert same_logits(model, theirs(model, config)) < 1e-5


def test_an_attending_stack_keeps_the_estimate_from_its_sizes():
    from titan_core.models.common.stats import flops_per_token

    model = ours(transformers.LlamaConfig(**SMALL, num_hidden_layers=2))
    assert not model.attention_free and model.flops_per_token(32) == flops_per_token(model.args, 32)


def test_attention_computed_inline_gets_transformers_masks():
    # MPT computes attention in its own forward, from the mask transformers builds: causal only with one
    config = transformers.MptConfig(d_model=64, n_heads=4, n_layers=2, vocab_size=256, max_seq_len=256)
    model = ours(config)
    assert list(model.attention_sites.own) == [0, 1] and list(model.attention_cores()) == []
    assert model.hf.config._attn_implementation == "titan_masked"
    ref = theirs(model, config)
    toks = tokens()
    assert same_logits(model, ref, toks) < 1e-6
    # causal: a later token does not change an earlier logit
    changed = toks.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    with torch.no_grad():
        assert torch.equal(model(toks)[:, :-1], model(changed)[:, :-1])


@pytest.mark.parametrize(
    "make, where",
    [
        # the decoder half of an encoder-decoder: its depth is decoder_layers, not num_hidden_layers
        (lambda: transformers.BartConfig(d_model=64, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                                         decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                         vocab_size=256, max_position_embeddings=256, dropout=0.0,
                                         attention_dropout=0.0, activation_dropout=0.0),
         "model.decoder.layers"),
        # an encoder used as a decoder: layers under encoder.layer, a transform before the head
        (lambda: transformers.BertConfig(**SMALL, num_hidden_layers=2, is_decoder=True, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0),
         "bert.encoder.layer"),
    ],  # fmt: skip
    ids=["bart", "bert"],
)
def test_layers_are_found_wherever_the_class_keeps_them(make, where):
    config = make()
    model = ours(config)
    assert model.base_prefix == where and len(model.layers) == 2
    assert len(list(model.attention_cores())) == 2
    ref = theirs(model, config)
    assert same_logits(model, ref) < 1e-5
    # the loss of next-token labels on those logits (upstream's own loss does not always shift: BART's does not)
    full = tokens(33)
    _, ce = model.loss(full[:, :-1], full[:, 1:])
    with torch.no_grad():
        logits = ref(input_ids=full[:, :-1], use_cache=False).logits
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), full[:, 1:].flatten())
    assert abs(ce.item() - want.item()) <= 1e-5 * want.item()


def test_bert_as_an_encoder_is_refused_not_run_bidirectionally():
    config = transformers.BertConfig(**SMALL, num_hidden_layers=2, is_decoder=False)
    model = ours(config)
    assert "its attention is not causal" in model.notes[0]
    with pytest.raises(KernelUnavailable, match="BertSelfAttention is not causal.*is_decoder = true"):
        model.loss(tokens(), tokens())


def test_a_composite_config_builds_and_exports_its_text_model():
    from titan_core.models.transformers import ADAPTER

    text = dict(**SMALL, num_hidden_layers=2, num_key_value_heads=2, head_dim=16, sliding_window=8)
    config = transformers.Gemma3Config(text_config=text)
    model = ours(config)
    assert type(model.hf).__name__ == "Gemma3ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in theirs(model, config).parameters())
    assert same_logits(model, theirs(model, config)) < 1e-5
    exported = ADAPTER.hf_config(ADAPTER.args_from_hf(config.to_dict())[0])
    assert exported["model_type"] == "gemma3_text" and exported["architectures"] == ["Gemma3ForCausalLM"]
    assert exported["num_hidden_layers"] == 2


def test_attention_sinks_run_in_the_naive_core_and_other_kernels_refuse_them():
    config = transformers.GptOssConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                       num_local_experts=4, num_experts_per_tok=2, sliding_window=8)  # fmt: skip
    model = ours(config)
    assert [type(c) for c in model.attention_cores()] == [NaiveAttention, NaiveAttention]
    with torch.no_grad():
        for layer in model.layers.values():
            layer.self_attn.sinks.normal_()  # transformers inits them at 0
    ref = theirs(model, config)
    assert same_logits(model, ref) < 1e-5
    apply_swaps(model, ["attention.sdpa"])
    with pytest.raises(KernelUnavailable, match="attention sinks.*kernels.attention=naive"):
        model.loss(tokens(), tokens())


def test_tensors_transformers_init_leaves_alone_get_their_constructor_values():
    # Apertus' xIELU keeps alpha/beta as parameters set in __init__: to_empty made them garbage
    config = transformers.ApertusConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2)
    model = ours(config)  # built on meta, materialised, seeded init, as the trainer does
    fresh = transformers.ApertusForCausalLM._from_config(config, dtype=torch.float32)
    act, want = model.layers["1"].mlp.act_fn, fresh.model.layers[1].mlp.act_fn
    for name in ("alpha_p", "alpha_n", "beta"):
        assert torch.equal(getattr(act, name), getattr(want, name)), name
    assert not any(torch.isnan(p).any() for p in model.parameters())
    full = tokens(33)
    _, ce = model.loss(full[:, :-1], full[:, 1:])
    assert abs(ce.item() - math.log(256)) > 1e-3  # not the uniform logits of an activation stuck at zero


def test_a_class_with_its_own_attention_table_runs_its_eager_attention_as_written():
    # Falcon picks its attention module from a table of its own, which knows no titan_core name
    config = transformers.FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=256,
                                       hidden_dropout=0.0, attention_dropout=0.0)  # fmt: skip
    model = ours(config)
    assert list(model.attention_sites.own) == [0, 1] and list(model.attention_cores()) == []
    assert "layers 0, 1 (FalconDecoderLayer" in model.notes[0]
    ref = theirs(model, config)
    toks = tokens()
    assert same_logits(model, ref, toks) < 1e-6
    changed = toks.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    with torch.no_grad():  # causal: a later token does not change an earlier logit
        assert torch.equal(model(toks)[:, :-1], model(changed)[:, :-1])


def test_a_size_that_varies_by_layer_is_read_for_the_estimates_as_its_largest():
    from titan_core.models.transformers import ADAPTER

    config = transformers.AutoConfig.for_model("gemma4_text", **SMALL, num_hidden_layers=2, head_dim=16,
                                               global_head_dim=32)  # fmt: skip
    with pytest.raises(Exception, match="per-layer attribute"):
        config.head_dim  # noqa: B018 -- transformers refuses the global read
    args, _ = ADAPTER.args_from_hf(config.to_dict())
    assert args.head_dim == max(layer.head_dim for layer in config.per_layer_config) == 32


def test_a_learned_per_token_logit_scale_of_the_head_reaches_the_loss_and_fused_ce():
    """Dory's head multiplies each token's logit by logit_scale * logit_scale_factor: a plain
    h @ W^T loss head would train another model (parity measured its logits 0.999 off)."""
    from onboard.compat.tiny import tiny_config

    config = transformers.AutoConfig.for_model(**tiny_config("dory"))
    model = ours(config)
    assert model.head_token_scale == pytest.approx(1 / config.initializer_range)
    with torch.no_grad():
        model.lm_head.logit_scale.uniform_(0.5 * config.initializer_range, 2 * config.initializer_range)
    same_head(model, config, "logit_scale")


def test_a_muP_divisor_and_a_padded_head_cut_to_the_unpadded_vocabulary_reach_the_loss_and_fused_ce():
    """Inkling divides its hidden states by logits_mup_width_multiplier (24) before the head and cuts
    the logits to unpadded_vocab_size of a padded head: without either, parity measured its logits
    23 times their size."""
    from onboard.compat.tiny import tiny_config

    # a head padded to 264 rows, 256 of them tokens
    config = transformers.AutoConfig.for_model(**{**tiny_config("inkling_text"), "vocab_size": 264,
                                                  "unpadded_vocab_size": 256})  # fmt: skip
    model = ours(config)
    assert model.logits_divisor == 24.0 and model.head_rows == 256 and model.output_weight.shape[0] == 264
    assert model.args.vocab_size == 256  # the tokens it predicts: the data draws from these
    assert model(tokens()).shape[-1] == 256
    same_head(model, config, "weight")


def test_a_decoder_self_attention_that_masks_causally_through_the_mask_runs_on_the_kernels():
    # BigBird-Pegasus leaves is_causal False on its decoder's self-attention (the causal mask does the
    # work); is_decoder says what it is
    from onboard.compat.tiny import tiny_config

    config = transformers.AutoConfig.for_model(**tiny_config("bigbird_pegasus"))
    model = ours(config)
    assert len(list(model.attention_cores())) == len(model.layers) == 2  # self-attention only, not encoder_attn
    assert same_logits(model, theirs(model, config)) < 1e-5


def test_attention_over_depth_runs_transformers_eager_and_the_notes_say_so():
    # Inkling2's attention residual: a fixed query attends over a position's earlier block outputs
    # (not causal, no mask: nothing for a sequence kernel), beside causal self-attention
    from onboard.compat.tiny import tiny_config

    config = transformers.AutoConfig.for_model(**tiny_config("inkling2_text"))
    model = ours(config)
    sites = model.attention_sites
    assert sites.upstream and all(p.split(".", 1)[1] in ("attention_input", "mlp_input") for p in sites.upstream)
    assert sites.paths and not sites.own  # every layer's self-attention still runs a titan_core core
    assert any("attend unmasked over something other than the sequence" in n for n in model.notes), model.notes
    assert same_logits(model, theirs(model, config)) < 1e-5
    # SimpleFSDP's parametrization subclasses each module in another file: its forward's file is the model's
    from titan_core.models.transformers.hf_attention import own_eager

    layer, path = sites.upstream[-1].split(".", 1)
    residual = model.layers[layer].get_submodule(path)
    wrapped = type("Wrapped", (type(residual),), {"__module__": "titan_core.parallel.simple_fsdp"})
    module = object.__new__(wrapped)
    assert own_eager(module) is own_eager(residual) is not None
    swapped = apply_swaps(model, ["attention.naive"])  # kernels.attention reaches the self-attention only
    assert swapped and all(p.endswith("self_attn.core") for p in swapped), swapped
    assert same_logits(model, theirs(model, config)) < 1e-5
    # the eager attention they run was found when the model was built: a compiled block looks no source up
    assert residual.upstream_attention is own_eager(residual)
    from titan_core.compile.per_block import explain_blocks, graph_breaks_total
    from titan_core.data.base import Batch

    toks = tokens(17)
    report = explain_blocks(model, Batch(toks[:, :-1], toks[:, 1:]))
    assert report and graph_breaks_total(report) == 0, report


def test_buffers_made_in_the_model_dtype_follow_mixed_precision_and_rope_stays_fp32():
    """MiniMax's lightning attention multiplies bf16 scores by its decay buffers, then meets bf16 values
    in a matmul: with the params in bf16 (mixed precision) and the buffers left fp32 that matmul
    refuses mixed dtypes. transformers makes those buffers in the model's dtype, so they follow the
    compute dtype; RoPE's inv_freq, made from an explicit float32 tensor, stays fp32 as it does there."""
    config = transformers.AutoConfig.for_model(
        "minimax", **SMALL, num_hidden_layers=2, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        layer_types=["full_attention", "linear_attention"],
    )  # fmt: skip
    model = ours(config)
    with torch.no_grad():
        want = model(tokens()).to(torch.bfloat16)
    for p in model.parameters():  # what SimpleFSDP's mixed precision hands the forward
        p.data = p.data.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="same dtype"):
        model(tokens())
    cast = model.buffers_follow(torch.bfloat16)
    assert cast and all("decay" in n or "slope" in n for n in cast), cast
    buffers = dict(model.named_buffers())
    assert all(buffers[n].dtype == torch.bfloat16 for n in cast)
    rope = [b.dtype for n, b in buffers.items() if n.endswith("inv_freq")]
    assert rope and set(rope) == {torch.float32}
    with torch.no_grad():
        got = model(tokens())
    assert got.dtype == torch.bfloat16 and rel_l2(got.float(), want.float()) < 0.02
    assert model.buffers_follow(torch.float32) == []


def test_parameters_transformers_keeps_in_fp32_are_named_for_mixed_precision():
    """Inkling-2's router weight (and its convolutions and depth queries) is made float32 explicitly:
    in transformers' bf16 model it stays fp32, and the router multiplies it with fp32 hidden states,
    so mixed precision must not gather it in bf16. The projections follow the compute dtype."""
    from onboard.compat.tiny import tiny_config

    model = ours(transformers.AutoConfig.for_model(**tiny_config("inkling2_loop_text")))
    kept = model.params_kept_fp32(torch.bfloat16)
    names = dict(model.named_parameters())
    routers = {n for n in names if n.endswith("mlp.gate.weight")}
    assert routers and routers <= kept and not any(n.endswith("q_proj.weight") for n in kept), sorted(kept)
    assert model.params_kept_fp32(torch.float32) == frozenset()
    router = model.hf.get_submodule(sorted(routers)[0].rpartition(".")[0])
    router(torch.randn(2, 8, 64))  # fp32 weight, fp32 inputs: as transformers runs it
    for p in router.parameters():  # what a bf16 gather would hand it
        p.data = p.data.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="same dtype"):
        router(torch.randn(2, 8, 64))


def test_layers_kept_in_two_stacks_are_all_wrapped_and_all_get_the_kernels():
    """HRM keeps a low- and a high-level stack of the same layer class and runs them in cycles: both
    are titan_core's layers (FSDP units, compiled blocks), both attention modules take the swaps,
    the notes say so, and the logits are transformers' own."""
    from onboard.compat.tiny import tiny_config

    config = transformers.AutoConfig.for_model(**tiny_config("hrm_text"))
    model = ours(config)
    assert model.stack_prefixes == ("model.L_module.layers", "model.H_module.layers") and len(model.layers) == 4
    assert model.layers["2"] is model.hf.model.H_module.layers[0]
    assert model.swap_paths["layers.*.attention.core"] == (
        "model.L_module.layers.*.self_attn.core", "model.H_module.layers.*.self_attn.core")
    assert any("2 stacks" in n for n in model.notes)
    assert isinstance(model.hf.model.H_module.layers[1].self_attn.core, SDPAttention)
    assert same_logits(model, theirs(model, config)) < 1e-5
    apply_swaps(model, swaps_for(Kernels(attention="naive")))
    assert all(isinstance(core, NaiveAttention) for core in model.attention_cores()) and len(list(model.attention_cores())) == 4
