"""The compat probe's tiny configs: built through each config class's own constructor arguments
(whatever it names its sizes), hybrids kept hybrid, composite configs shrunk in their text config,
a validator's refusal answered by the next relaxation, and each tiny config buildable by the
transformers path at a size a CPU climbs."""

from __future__ import annotations

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

from onboard.compat.tiny import MAX_PARAMS, NotProbed, tiny_config  # noqa: E402
from titan_core.models.transformers.hf_classes import config_object  # noqa: E402


def built(cfg: dict) -> torch.nn.Module:
    """The transformers path's model of `cfg`, on meta."""
    from titan_core.models.transformers import ADAPTER, TransformersCausalLM

    args, _ = ADAPTER.args_from_hf(cfg)
    with torch.device("meta"):
        return TransformersCausalLM(args)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_sizes_go_under_the_names_the_class_gives_them():
    gpt2 = tiny_config("gpt2")
    assert (gpt2["n_embd"], gpt2["n_layer"], gpt2["n_head"], gpt2["vocab_size"]) == (64, 2, 4, 256)
    assert gpt2["attn_pdrop"] == gpt2["resid_pdrop"] == gpt2["embd_pdrop"] == 0.0
    # Falcon: key/value heads are `num_kv_heads`, and head_dim is derived (a property, not an argument)
    falcon = tiny_config("falcon")
    assert (falcon["hidden_size"], falcon["num_kv_heads"]) == (64, 2) and "head_dim" not in falcon
    assert config_object(falcon).head_dim == 16
    # an argument stored under another name: Qwen3-MoE's and Bailing's `num_local_experts` is `num_experts`
    for model_type in ("qwen3_moe", "bailing_hybrid"):
        assert config_object(tiny_config(model_type)).num_experts == 4, model_type
    assert tiny_config("bailing_hybrid")["num_expert_group"] == 2  # of 8, which 4 experts cannot be split in


def test_an_encoder_decoder_config_shrinks_the_encoder_its_aliases_read():
    """PLBart's `num_attention_heads` reads `encoder_attention_heads`: left at 12 beside a hidden of 64,
    the derived head_dim was 64 // 12 = 5, which the eager rung refused as odd."""
    plbart = tiny_config("plbart")
    assert (plbart["encoder_attention_heads"], plbart["decoder_attention_heads"]) == (4, 4)
    assert (plbart["encoder_layers"], plbart["encoder_ffn_dim"]) == (2, 128)
    config = config_object(plbart)
    assert config.hidden_size // config.num_attention_heads == 16


def test_a_hybrid_keeps_one_layer_of_each_kind():
    cfg = tiny_config("gemma3_text")  # five sliding-window layers to one global in the full model
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"] and cfg["num_hidden_layers"] == 2
    assert cfg["sliding_window"] == 32
    qwen3_next = tiny_config("qwen3_next")  # linear attention beside full attention
    assert set(qwen3_next["layer_types"]) == {"linear_attention", "full_attention"}
    assert qwen3_next["num_hidden_layers"] == len(qwen3_next["layer_types"])


def test_a_size_given_per_layer_shrinks_entry_by_entry_and_is_read_as_its_largest():
    # Gemma-3n's intermediate_size is a list by layer: each entry shrinks, and the path's args read
    # the largest (one number sizes the estimates; transformers builds each layer from its own)
    from titan_core.models.transformers import ADAPTER

    cfg = tiny_config("gemma3n_text")
    assert cfg["intermediate_size"] == [128] * cfg["num_hidden_layers"]
    args, _ = ADAPTER.args_from_hf(cfg)
    assert args.ffn_hidden_dim == 128


def test_a_table_of_per_layer_sizes_keeps_the_kept_layers_at_the_tiny_sizes():
    # Dots3's per_layer_config gives its sliding-window layers 64 heads of 256 and latent ranks of 1024
    # (39M parameters in one tiny layer before): each kept layer's entry takes the tiny sizes
    cfg = tiny_config("dots3_note_text")
    assert "sliding_attention" in cfg["layer_types"]
    model = built(cfg)
    assert 0 < n_params(model) < 1_000_000
    # a layer a whole factor wider than the class's default stays that much wider: Gemma-4's global heads
    gemma4 = tiny_config("gemma4_text")
    assert list(gemma4["per_layer_config"].values()) == [{"head_dim": 2 * gemma4["head_dim"]}]
    composite = tiny_config("dots3_note")  # its vision and audio adapters' widths follow the text's hidden size
    assert composite["text_config"]["hidden_size"] == composite["vision_config"]["adapter_out_dim"] == 64


def test_a_sparse_attention_indexer_keeps_fewer_keys_than_parity_runs():
    # at the class's 2048 keys per query the selection drops none of the parity rung's 512
    for model_type in ("deepseek_v32", "glm_moe_dsa", "dots3_note_text"):
        assert tiny_config(model_type)["index_topk"] == 32
    assert tiny_config("qwen4_exp_text")["indexer_budget"] == 32


def test_a_model_whose_first_layers_are_dense_keeps_an_moe_layer():
    cfg = tiny_config("deepseek_v3")
    assert (cfg["first_k_dense_replace"], cfg["num_hidden_layers"], cfg["n_routed_experts"]) == (1, 2, 4)
    assert (cfg["kv_lora_rank"], cfg["q_lora_rank"], cfg["v_head_dim"]) == (32, 32, 16)
    assert n_params(built(cfg)) < MAX_PARAMS


def test_a_validator_refusal_is_answered_by_the_next_relaxation():
    # ZAYA's validator allows one expert per token only; the other tiny sizes stay
    cfg = tiny_config("zaya")
    assert (cfg["num_experts_per_tok"], cfg["hidden_size"], cfg["num_experts"]) == (1, 64, 4)


def test_a_composite_config_is_shrunk_in_its_text_config():
    cfg = tiny_config("gemma3")
    assert cfg["model_type"] == "gemma3"
    text = cfg["text_config"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]) == (64, 2, 256)
    model = built(cfg)
    assert type(model.hf).__name__ == "Gemma3ForCausalLM" and n_params(model) < MAX_PARAMS


def test_an_encoder_built_inside_the_causal_lm_is_shrunk_too():
    # GIT's causal-LM class holds its image encoder: its vision config is made tiny with the rest
    cfg = tiny_config("git")
    assert cfg["vision_config"]["hidden_size"] == 64
    assert n_params(built(cfg)) < MAX_PARAMS


def test_a_class_that_cannot_be_built_small_is_not_probed_with_why():
    with pytest.raises(NotProbed, match="transformers has no config class for 'no_such_model'"):
        tiny_config("no_such_model")
    with pytest.raises(NotProbed, match="MusicgenConfig holds no single text config"):
        tiny_config("musicgen")


@pytest.mark.parametrize("model_type", ["llama", "phi", "roberta", "jamba", "nemotron_h", "lfm3", "mllama", "falcon"])
def test_the_architectures_the_issue_names_build_tiny(model_type):
    model = built(tiny_config(model_type))
    assert 0 < n_params(model) < MAX_PARAMS and len(model.layers) >= 2


def test_a_class_that_attends_ahead_is_measured_not_to_be_a_causal_lm():
    from onboard.compat.causal import NOT_CAUSAL, check_causal

    check_causal(tiny_config("llama"))  # causal: nothing raised
    check_causal(tiny_config("roberta"))  # an encoder class as the decoder its config says it is (is_decoder)
    with pytest.raises(NotProbed, match=f"^{NOT_CAUSAL}XLNetLMHeadModel changes its logits at earlier positions"):
        check_causal(tiny_config("xlnet"))  # a permutation LM



def test_a_class_whose_own_forward_needs_another_models_states_is_not_probed_with_the_error():
    """Gemma-4's assistant drafts for another model and reads its key/value states: transformers' own
    class raises on input ids alone. Not probed (still counted against the table), not "not causal"."""
    from onboard.compat.causal import NOT_CAUSAL, check_causal

    with pytest.raises(NotProbed, match="cannot run a forward on input ids alone \\(KeyError: 'sliding_attention'\\)") as e:
        check_causal(tiny_config("gemma4_unified_assistant"))
    assert not str(e.value).startswith(NOT_CAUSAL)


def test_latent_attention_and_group_routing_get_sizes_that_run():
    # multi-head latent attention expands keys to every head; group-limited routing needs its
    # groups to divide the experts: transformers' own class then runs the tiny config
    cfg = tiny_config("deepseek_v3")
    assert cfg["num_key_value_heads"] == cfg["num_attention_heads"] == 4
    assert (cfg["n_group"], cfg["topk_group"]) == (2, 1)
    model = built(cfg)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    toks = torch.randint(0, 256, (2, 16))
    loss, _ = model.loss(toks, toks)
    assert torch.isfinite(loss)
    # LongCat-Flash sizes its rotary tables by head_dim, which its defaults tie to the RoPE width
    longcat = tiny_config("longcat_flash")
    assert longcat["head_dim"] == longcat["qk_rope_head_dim"] == 8


def test_learned_positions_cover_the_parity_sequence():
    # Blenderbot learns 128 positions, RoBERTa offsets its positions by 2: parity runs 512 tokens
    assert tiny_config("blenderbot")["max_position_embeddings"] == tiny_config("camembert")["max_position_embeddings"]
    assert tiny_config("blenderbot")["max_position_embeddings"] >= 512 + 2


@pytest.mark.parametrize("model_type", ["mamba", "mamba2", "rwkv"])
def test_a_stack_with_no_attention_builds_tiny(model_type):
    # Mamba-2's validator wants its SSM heads x head width = 2 x hidden, which the role sizes alone break
    cfg = tiny_config(model_type)
    model = built(cfg)
    assert model.attention_free and 0 < n_params(model) < MAX_PARAMS and len(model.layers) == 2
    if model_type == "mamba2":
        assert cfg["num_heads"] * cfg["head_dim"] == 2 * cfg["hidden_size"]


@pytest.mark.parametrize("model_type", ["dots1", "dbrx", "lfm2_moe", "qwen4_exp", "cohere_compass_text", "dory", "zamba", "xmod", "moshi"])
def test_a_class_whose_defaults_cannot_build_its_model_gets_what_a_released_config_sets(model_type):
    # transformers' own class, from the tiny config: its defaults alone leave a None its model reads
    # (dots1's experts, DBRX's rope_theta, LFM2-MoE's layer kinds, the indexer's budget, Zamba's
    # second shared-transformer layer, X-MOD's language, Moshi's audio vocabulary)
    import transformers

    cfg = tiny_config(model_type)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    logits = model(torch.randint(0, 256, (1, 16))).logits
    assert logits.shape == (1, 16, 256) and torch.isfinite(logits).all()


def test_a_moe_whose_first_layers_are_dense_keeps_an_moe_layer():
    """Flint's default mlp_only_layers would leave both tiny layers dense: parity could not route a
    token through an expert of a config that declares them."""
    model = built(tiny_config("flint"))
    assert [n for n, _ in model.named_parameters() if n.endswith("mlp.gate.weight")] == ["model.layers.1.mlp.gate.weight"]


def test_a_fresh_tiny_model_predicts_its_own_vocabulary_near_uniformly():
    """Inkling-2's head is `unpadded_vocab_size` wide (200058 by default): kept, a fresh model's loss is
    ln(200058), far from the eager rung's ln(256). MiniCPM3's dim_model_base is a ratio to the hidden
    width: kept at 256 beside a hidden of 64, the fresh logits start 40x the released scale."""
    import math

    import transformers

    for model_type in ("inkling2_text", "minicpm3"):
        cfg = tiny_config(model_type)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
        ids = torch.randint(0, 256, (2, 64))
        out = model(input_ids=ids, labels=ids)
        assert out.logits.shape[-1] == 256, model_type
        assert abs(out.loss.item() / math.log(256) - 1) <= 0.25, (model_type, out.loss.item())
    minicpm3 = tiny_config("minicpm3")
    assert minicpm3["hidden_size"] / minicpm3["dim_model_base"] == pytest.approx(2560 / 256, rel=0.1)
