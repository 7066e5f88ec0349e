"""HF <-> native: tiny transformers models with random weights, mapped through each family's
adapter, must give the same logits, loss and gradients as the native model, round-trip
bit-exactly, and have their configs read into the right args with no key left unaccounted for.

Logits, loss and gradients are held to the parity gate: its sequence length and thresholds
are checklists/parity.yaml's, stated in tests/core/core_bounds.py (this folder tests titan_core
without onboard, whose reader parses the checklists; a test in tests/onboard holds the two equal).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")

from core_bounds import (  # noqa: E402
    PARITY_GRAD_REL_L2,
    PARITY_LOGITS_MAX_ABS,
    PARITY_LOGITS_REL_L2,
    PARITY_LOSS_ABS,
    PARITY_SEQ_LEN,
)
from titan_core.models.common.hf_adapter import AdapterError  # noqa: E402
from titan_core.models.registry import build_meta, family_for_hf_model_type, get_family  # noqa: E402
from titan_core.measure.numerics import max_abs, rel_l2  # noqa: E402

pytestmark = pytest.mark.hf

# the parity gate's thresholds and sequence length (checklists/parity.yaml)
SEQ = PARITY_SEQ_LEN
LOGITS_REL_L2, LOGITS_MAX_ABS = PARITY_LOGITS_REL_L2, PARITY_LOGITS_MAX_ABS
LOSS_ABS, GRAD_REL_L2 = PARITY_LOSS_ABS, PARITY_GRAD_REL_L2
BATCH = 2
MAX_POSITIONS = 2 * SEQ

TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=128, max_position_embeddings=MAX_POSITIONS,
)  # fmt: skip
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    # small enough that the 16-wide heads of the tiny model have scaled, blended and kept bands
    original_max_position_embeddings=64,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)

# name -> (config, fields the native args must have)
CASES = {
    "llama": (
        lambda: transformers.LlamaConfig(**TINY, rope_parameters=LLAMA3_ROPE),
        {"rope_theta": 500000.0, "rope_scaling": {k: LLAMA3_ROPE[k] for k in list(LLAMA3_ROPE)[2:]}},
    ),
    "mistral": (
        lambda: transformers.MistralConfig(**TINY, sliding_window=32),
        {"sliding_window": 32, "global_every": 0, "qkv_bias": False},
    ),
    "qwen2": (
        lambda: transformers.Qwen2Config(**TINY),
        {"qkv_bias": True, "out_bias": False, "qk_norm": False, "sliding_window": None},
    ),
    "qwen3": (
        # explicit head_dim != hidden / heads, and a tied head, as in Qwen3-0.6B
        lambda: transformers.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=True),
        {"qk_norm": True, "head_dim": 32, "tie_embeddings": True, "qkv_bias": False},
    ),
    "qwen3_window_pattern": (
        # windowed and global layers alternate: every 2nd layer global
        lambda: transformers.Qwen3Config(
            **TINY,
            head_dim=16,
            use_sliding_window=True,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention"],
        ),
        {"sliding_window": 32, "global_every": 2, "qk_norm": True},
    ),
    "qwen3_moe": (
        lambda: transformers.Qwen3MoeConfig(**TINY, **MOE, head_dim=16, norm_topk_prob=True),
        {"n_experts": 4, "top_k": 2, "moe_hidden_dim": 32, "norm_topk_prob": True, "qk_norm": True, "dense_layers": []},
    ),
    "qwen3_moe_mixed": (
        lambda: transformers.Qwen3MoeConfig(
            **TINY,
            **MOE,
            head_dim=16,
            norm_topk_prob=False,
            mlp_only_layers=[0],
            output_router_logits=True,
            router_aux_loss_coef=0.02,
        ),
        {"dense_layers": [0], "norm_topk_prob": False, "aux_loss_coef": 0.02, "moe_every": 1},
    ),
}


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights far from HF's init (norms != 1, biases != 0, O(1) activations), so a wrong
    mapping (swapped q/k norms, a transposed expert) cannot hide behind a trivial value."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)


def hf_model(case: str, attn: str = "sdpa"):
    cfg = CASES[case][0]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    randomize_(model, seed=1)
    return model.eval()


def native_from_hf(model):
    fam = family_for_hf_model_type(model.config.model_type)
    args, _ = fam.adapter.args_from_hf(model.config.to_dict())
    native = build_meta(fam.name, args)
    native.to_empty(device="cpu")
    native.init_weights(seed=0)  # also computes the (non-persistent) RoPE frequencies
    native.load_state_dict(fam.adapter.from_hf(model.state_dict()), strict=True)
    return fam, args, native.eval()


def _tokens(vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def grad_errors(upstream, native, to_hf) -> tuple[set[str], set[str], dict[str, float]]:
    """(HF parameters with no mapped native gradient, mapped names HF lacks, rel L2 per shared name).

    Every name of a tied tensor on both sides (remove_duplicate=False), so a tie is compared under
    each name; a parameter without a gradient counts as a zero one (an expert no token reached).
    """

    def grads(model):
        return {
            n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
            for n, p in model.named_parameters(remove_duplicate=False)
        }

    mapped, hf = to_hf(grads(native)), grads(upstream)
    shared = set(mapped) & set(hf)
    return set(hf) - shared, set(mapped) - shared, {n: rel_l2(mapped[n], hf[n]) for n in sorted(shared)}


def logit_errors(case: str, attn: str = "sdpa") -> tuple[float, float]:
    model = hf_model(case, attn)
    _, _, native = native_from_hf(model)
    tokens = _tokens(model.config.vocab_size, 2)
    with torch.no_grad():
        ref = model(tokens).logits
        out = native(tokens)
    return rel_l2(out, ref), max_abs(out, ref)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_hf(case, attn):
    rel, abs_ = logit_errors(case, attn)
    assert rel <= LOGITS_REL_L2 and abs_ <= LOGITS_MAX_ABS, (
        f"{case} ({attn}, seq {SEQ}): logits rel L2 {rel:.3g} (gate {LOGITS_REL_L2:g}), "
        f"max abs {abs_:.3g} (gate {LOGITS_MAX_ABS:g})"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_grads_match_hf(case):
    """Cross-entropy (as the parity rung measures it: the aux loss is a training choice) and every
    parameter's gradient, mapped to HF names by the adapter."""
    model = hf_model(case)
    fam, _, native = native_from_hf(model)
    tokens, labels = _tokens(model.config.vocab_size, 2), _tokens(model.config.vocab_size, 3)
    _, native_ce = native.loss(tokens, labels)
    hf_ce = torch.nn.functional.cross_entropy(model(tokens).logits.flatten(0, 1).float(), labels.flatten())
    diff = abs(native_ce.item() - hf_ce.item())
    assert diff <= LOSS_ABS, f"{case} (seq {SEQ}): loss abs diff {diff:.3g} (gate {LOSS_ABS:g})"
    native_ce.backward()
    hf_ce.backward()
    missing, extra, errors = grad_errors(model, native, fam.adapter.to_hf)
    assert not missing and not extra, (missing, extra)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRAD_REL_L2, (
        f"{case} (seq {SEQ}): gradient of {worst} rel L2 {errors[worst]:.3g} (gate {GRAD_REL_L2:g})"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_args_from_hf(case):
    cfg = CASES[case][0]()
    fam = family_for_hf_model_type(cfg.model_type)
    args, _ = fam.adapter.args_from_hf(cfg.to_dict())
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.vocab_size) == (64, 2, 4, 2, 128)
    assert args.ffn_hidden_dim == 128 and args.max_seq_len == MAX_POSITIONS
    for field, expected in CASES[case][1].items():
        assert getattr(args, field) == expected, field
    assert fam.adapter.unconsumed_keys(cfg.to_dict()) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trip_is_exact(case):
    model = hf_model(case)
    fam, _, native = native_from_hf(model)
    hf_sd = model.state_dict()
    back = fam.adapter.to_hf(fam.adapter.from_hf(hf_sd))
    assert sorted(back) == sorted(hf_sd)
    for key, value in hf_sd.items():
        assert back[key].shape == value.shape and torch.equal(back[key], value), key
    native_sd = native.state_dict()
    again = fam.adapter.from_hf(fam.adapter.to_hf(native_sd))
    assert sorted(again) == sorted(native_sd)
    assert all(torch.equal(again[k], v) for k, v in native_sd.items())


@pytest.mark.parametrize("case", ["qwen3_moe", "qwen3_moe_mixed"])
def test_moe_reads_per_expert_checkpoint_layout(case):
    """Published checkpoints store each expert's projections separately (gate rows first)."""
    model = hf_model(case)
    adapter = get_family("qwen3_moe").adapter
    fused = model.state_dict()
    on_disk = {}
    for key, value in fused.items():
        prefix, _, leaf = key.rpartition(".experts.")
        if leaf == "gate_up_proj":
            hidden = value.shape[1] // 2
            for e in range(value.shape[0]):
                on_disk[f"{prefix}.experts.{e}.gate_proj.weight"] = value[e, :hidden].clone()
                on_disk[f"{prefix}.experts.{e}.up_proj.weight"] = value[e, hidden:].clone()
        elif leaf == "down_proj":
            for e in range(value.shape[0]):
                on_disk[f"{prefix}.experts.{e}.down_proj.weight"] = value[e].clone()
        else:
            on_disk[key] = value
    a, b = adapter.from_hf(fused), adapter.from_hf(on_disk)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    del on_disk["model.layers.1.mlp.experts.3.up_proj.weight"]
    with pytest.raises(AdapterError, match="up_proj present for experts"):
        adapter.from_hf(on_disk)


@pytest.mark.parametrize("family", ["llama3", "qwen3", "qwen3_moe", "glimmer"])
def test_hf_config_round_trips_through_transformers(family):
    """args -> hf_config -> (the transformers config class, when one exists) -> args."""
    fam = get_family(family)
    flavors = [n for n in fam.flavors if n.startswith("debugmodel")]
    for flavor in flavors:
        args = fam.flavors[flavor]
        cfg = fam.adapter.hf_config(args)
        if cfg["model_type"] in transformers.CONFIG_MAPPING:
            cfg = transformers.AutoConfig.for_model(**cfg).to_dict()
        back, _ = fam.adapter.args_from_hf(cfg)
        assert back == args, flavor
        assert fam.adapter.unconsumed_keys(cfg) == [], flavor


def test_glimmer_state_dict_round_trip():
    fam = get_family("glimmer")
    model = build_meta("glimmer", fam.flavors["debugmodel"])
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    sd = model.state_dict()
    hf = fam.adapter.to_hf(sd)
    assert "model.layers.3.self_attn.q_norm.weight" in hf and hf["lm_head.weight"] is sd["tok_embeddings.weight"]
    back = fam.adapter.from_hf(hf)
    assert sorted(back) == sorted(sd) and all(torch.equal(back[k], v) for k, v in sd.items())


def test_unknown_config_keys_are_reported_not_dropped():
    adapter = get_family("qwen3").adapter
    cfg = transformers.Qwen3Config(**TINY).to_dict()
    cfg["attn_logit_softcapping"] = 50.0
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "mrope_section": [8, 8]}
    assert adapter.unconsumed_keys(cfg) == ["attn_logit_softcapping", "rope_parameters.mrope_section"]


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}, "partial"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        # Qwen2-style windowed suffix (layers >= max_window_layers) has no native equivalent
        ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1, "layer_types": None}, "pattern"),
    ],
)
def test_unsupported_configs_are_refused(edit, message):
    cfg = {**transformers.Qwen2Config(**TINY).to_dict(), **edit}
    if cfg.get("layer_types") is None:
        cfg.pop("layer_types")
    with pytest.raises(AdapterError, match=message):
        get_family("qwen3").adapter.args_from_hf(cfg)


def test_qwen2_all_layers_windowed_is_read():
    cfg = transformers.Qwen2Config(**TINY, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    args, _ = get_family("qwen3").adapter.args_from_hf(cfg.to_dict())
    assert args.sliding_window == 16 and args.global_every == 0


def test_moe_aux_loss_coef_follows_output_router_logits():
    """HF adds router_aux_loss_coef * aux to the loss only when output_router_logits is set."""
    adapter = get_family("qwen3_moe").adapter
    off = transformers.Qwen3MoeConfig(**TINY, **MOE, router_aux_loss_coef=0.02).to_dict()
    on = {**off, "output_router_logits": True}
    assert adapter.args_from_hf(off)[0].aux_loss_coef == 0.0
    assert adapter.args_from_hf(on)[0].aux_loss_coef == 0.02


def test_moe_layer_aux_loss_matches_hf_formula():
    """One layer's load-balancing loss equals HF's load_balancing_loss_func on that layer
    (several layers: tests/core/unit/test_moe_aux_loss.py)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from titan_core.models.common.moe import MoE, load_balancing_loss, routing_stats

    moe = MoE(64, 32, 4, 2)
    torch.nn.init.normal_(moe.router.gate.weight, std=0.5)
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(3))
    probs, _, experts = moe.router(x)
    native = load_balancing_loss(routing_stats(probs, experts, 4), 1)
    ref = load_balancing_loss_func((moe.router.gate(x),), 4, 2)
    torch.testing.assert_close(native, ref, rtol=1e-6, atol=0)


def test_tied_head_that_differs_is_refused():
    adapter = get_family("qwen3").adapter
    emb = torch.randn(8, 4)
    sd = {"model.embed_tokens.weight": emb, "lm_head.weight": emb + 1, "model.norm.weight": torch.ones(4)}
    assert "output.weight" in adapter.from_hf(sd)  # untied unless told otherwise
    with pytest.raises(AdapterError, match="differs"):
        adapter.from_hf(sd, tie_embeddings=True)


# config.json of published checkpoints (transformers 4.x format: top-level rope_theta,
# rope_scaling), as they are read from disk
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}  # fmt: skip


@pytest.mark.parametrize(
    "cfg, family, flavor", [(QWEN3_30B_A3B, "qwen3_moe", "30B-A3B"), (LLAMA_31_8B, "llama3", "8B")]
)
def test_published_config_reads_as_the_flavor(cfg, family, flavor):
    fam = family_for_hf_model_type(cfg["model_type"])
    assert fam.name == family
    args, _ = fam.adapter.args_from_hf(cfg)
    assert args == fam.flavors[flavor]
    assert fam.adapter.unconsumed_keys(cfg) == []
