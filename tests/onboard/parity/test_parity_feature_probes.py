"""What each declared feature is, and how parity makes it active (onboard/parity/features.py)."""

from __future__ import annotations

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import torch

from onboard.parity import feature_pass, features
from onboard.parity.criteria import params
from onboard.upstream.hf_model import build_upstream

pytestmark = pytest.mark.hf

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=64)


def _declared(config):
    return {n: f for n, f in features.declare(config).items() if f.declared}


def test_declared_features_come_from_the_upstream_config():
    import transformers as tf

    gemma = _declared(tf.Gemma2Config(**SMALL, head_dim=16, sliding_window=64, pad_token_id=0))
    assert set(gemma) == {"attention_softcap", "final_softcap", "sliding_window", "padding"}
    assert (gemma["attention_softcap"].config, gemma["final_softcap"].config) == ({"cap": 50.0}, {"cap": 30.0})
    assert features.layer_windows(tf.Gemma2Config(**SMALL, sliding_window=64)) == [64]  # layer 1 is global
    assert features.layer_windows(tf.MistralConfig(**SMALL, sliding_window=64)) == [64, 64]
    assert features.layer_windows(tf.Qwen3Config(**SMALL, sliding_window=64)) == []  # use_sliding_window false
    moe = _declared(tf.Qwen3MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2))
    assert set(moe) == {"experts"} and moe["experts"].config == {"n_experts": 4, "top_k": 2, "router_rows": [4]}
    assert _declared(tf.LlamaConfig(**SMALL)) == {}
    # Doge sizes 16384 experts by default and builds them only with is_moe: no MoE layer, no experts feature
    assert "experts" not in _declared(tf.DogeConfig(**SMALL, num_experts=4))
    assert "experts" in _declared(tf.DogeConfig(**SMALL, num_experts=4, is_moe=True))


def test_sequence_grows_to_twice_the_largest_window_and_padding_goes_at_the_end():
    import transformers as tf

    p = params()
    declared = features.declare(tf.Gemma2Config(**SMALL, sliding_window=400, pad_token_id=3))
    seq = features.seq_len_for(declared, 512, p)
    assert seq == 400 * p["feature_window_seq_factor"]
    tokens, _ = features.make_inputs(64, 2, seq, 0, declared, p)
    n = int(seq * p["feature_pad_fraction"])
    assert (tokens[0, -n:] == 3).all() and tokens.shape == (2, seq)
    features.record_static(declared, tokens, seq, p)
    assert declared["sliding_window"].exercised and declared["padding"].value >= n


def test_probe_reads_the_scores_inside_the_upstream_attention_and_restores_it():
    import transformers as tf

    cfg = tf.Gemma2Config(**SMALL, head_dim=16, query_pre_attn_scalar=16, sliding_window=64).to_dict()
    hf = build_upstream(cfg, seed=0).model
    module = __import__(type(hf).__module__, fromlist=["eager_attention_forward"])
    original = module.eager_attention_forward
    declared = features.declare(hf.config)
    tokens = torch.randint(0, 64, (1, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), features.Probe(hf, declared) as probe:
        hf(input_ids=tokens)
    assert module.eager_attention_forward is original
    assert probe.attention.fraction == 0.0 and probe.attention.total > 0  # seeded scores are tiny
    # causal and window masks come from upstream: layer 0 keeps q - k < 64, layer 1 everything causal
    assert probe.attention.total == 2 * (sum(min(i + 1, 64) for i in range(128)) + 128 * 129 // 2)
    features.record_probe(declared, probe, "seeded", params())
    assert not declared["attention_softcap"].exercised and declared["attention_softcap"].value == 0.0
    how = feature_pass.prepare_feature_pass(hf, declared, tokens, params())
    assert "q/k projections x" in how
    with torch.no_grad(), features.Probe(hf, declared) as probe:
        hf(input_ids=tokens)
    assert probe.attention.fraction >= params()["feature_softcap_clipped_min"]
    assert probe.final.fraction >= params()["feature_softcap_clipped_min"]


def test_collapsed_routing_is_rebalanced_until_every_expert_gets_tokens():
    """Random tokens' hidden states share one direction; a router aligned with it sends
    every token to the same experts (the qwen3_moe debugmodel's layer 3 at its seeded init)."""
    import transformers as tf

    cfg = tf.Qwen3MoeConfig(**SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    hf = build_upstream(cfg.to_dict(), seed=0).model
    declared = features.declare(hf.config)
    tokens = torch.randint(0, 64, (1, 256), generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    shared = torch.randn(32, generator=gen)
    with torch.no_grad():  # every token's hidden state gets the same large component...
        hf.model.embed_tokens.weight.add_(shared)
        for router in features.Probe(hf, declared).routers().values():  # ...which favours experts 0 and 1
            sign = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]])
            router.weight.copy_(sign * shared + 0.05 * torch.randn(router.weight.shape, generator=gen))
    with torch.no_grad(), features.Probe(hf, declared) as probe:
        hf(input_ids=tokens)
    features.record_probe(declared, probe, "seeded", params())
    assert declared["experts"].value == 0 and not declared["experts"].exercised
    how = feature_pass.prepare_feature_pass(hf, declared, tokens, params())
    assert "projected off their inputs' mean direction" in how
    with torch.no_grad(), features.Probe(hf, declared) as probe:
        hf(input_ids=tokens)
    features.record_probe(declared, probe, "features", params())
    assert declared["experts"].exercised and declared["experts"].value >= params()["feature_min_tokens_per_expert"]
    assert "got 0 tokens in the seeded pass; then every expert got" in declared["experts"].how


def test_idle_names_each_declared_feature_no_pass_had_active():
    """What a failed features_exercised shows (and compat's one-line reason with it)."""
    fs = {
        "attention_softcap": features.Feature("attention_softcap", "attention soft-cap", True, True, "12% clipped"),
        "sliding_window": features.Feature("sliding_window", "window", True, False, "seq_len 32 <= window 64"),
        "experts": features.Feature("experts", "experts", False),
    }
    assert features.idle(fs) == ["sliding_window (seq_len 32 <= window 64)"]
    assert features.exercised(fs) is False
    fs["sliding_window"] = features.Feature("sliding_window", "window", True, True)
    assert features.idle(fs) == [] and features.exercised(fs) is True


def test_compat_reason_of_an_idle_feature_names_it():
    from onboard.compat import failure_reason

    entry = {
        "status": "failed",
        "criteria": [
            {"name": "logits_rel_l2", "ok": True, "value": 0.0, "comparator": "<=", "threshold": 1e-5},
            {"name": "features_exercised", "ok": False, "value": False, "comparator": "is_true", "hint": "idle"},
        ],
        "measurements": {"features_exercised": False, "features_idle": ["experts (3 of 4 experts got tokens)"]},
    }
    assert failure_reason(entry) == "features_exercised: features_idle: ['experts (3 of 4 experts got tokens)']"
    del entry["measurements"]["features_idle"]  # none taken (an older ledger): the checklist's hint
    assert failure_reason(entry) == "features_exercised: idle"


# JetMoE routes its attention heads too (self_attention.experts.router.layer); Inkling's gate scores
# its shared experts too (4 + 2 rows), LongCat-Flash's classifier its zero-compute experts
@pytest.mark.parametrize("model_type, router", [("jetmoe", "router.layer"), ("hunyuan_v1_moe", "mlp.gate.wg"),
                                                ("inkling_text", "mlp.gate"), ("longcat_flash", "router.classifier")])
def test_a_router_kept_inside_a_gate_or_router_module_is_found_and_its_experts_counted(model_type, router):
    import transformers as tf

    from onboard.compat.tiny import tiny_config

    hf = build_upstream(tf.AutoConfig.for_model(**tiny_config(model_type)).to_dict(), seed=0).model
    declared = features.declare(hf.config)
    routers = features.Probe(hf, declared).routers()
    assert routers and all(name.endswith(router) for name in routers), list(routers)
    tokens = torch.randint(0, hf.config.vocab_size, (1, 256), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), features.Probe(hf, declared) as probe:
        hf(input_ids=tokens)
    features.record_probe(declared, probe, "seeded", params())
    assert declared["experts"].value is not None and "no router output found" not in declared["experts"].how
    # the routed experts are counted, not a shared or zero-compute one
    assert {len(c) for c in probe.expert_counts.values()} == {declared["experts"].config["n_experts"]}


def test_an_expert_starved_off_the_mean_direction_is_aimed_at_a_token():
    """Laguna's sigmoid router at its seeded init sends none of 128 random tokens (nor of parity's
    1024) to one of its 4 experts, and projecting the rows off the inputs' mean direction changes
    nothing for it: the starved expert's row is then aimed at the token it came closest to winning."""
    import transformers as tf

    from onboard.compat.tiny import tiny_config

    hf = build_upstream(tf.AutoConfig.for_model(**tiny_config("laguna")).to_dict(), seed=0).model
    declared = features.declare(hf.config)
    tokens, _ = features.make_inputs(hf.config.vocab_size, 1, 128, 0, declared, params())
    with torch.no_grad(), features.Probe(hf, declared) as probe:
        hf(input_ids=tokens)
    features.record_probe(declared, probe, "seeded", params())
    assert declared["experts"].value == 0
    how = feature_pass.prepare_feature_pass(hf, declared, tokens, params())
    assert "starved experts aimed at a token" in how
    with torch.no_grad(), features.Probe(hf, declared) as probe:
        hf(input_ids=tokens)
    features.record_probe(declared, probe, "features", params())
    assert declared["experts"].exercised, declared["experts"].how


def test_a_routing_table_init_leaves_constant_spreads_tokens_over_the_experts_when_seeded():
    # DeepSeek-V4's hash layers route token id -> experts by a table transformers inits to zeros
    # (a checkpoint fills it): seeded as it is, every token would go to expert 0 and the others idle
    from onboard.compat.tiny import tiny_config

    hf = build_upstream(tiny_config("deepseek_v4"), seed=0).model
    gate = next(m for m in hf.modules() if hasattr(m, "tid2eid"))
    table, experts = gate.tid2eid, gate.weight.shape[0]
    assert table.shape[1] > 1 and int(table.min()) >= 0 and int(table.max()) < experts
    assert all(len(set(row.tolist())) == table.shape[1] for row in table)  # each token: distinct experts
    assert torch.bincount(table.flatten(), minlength=experts).min() > 0
    assert torch.equal(build_upstream(tiny_config("deepseek_v4"), seed=0).model.state_dict()[
        next(k for k in hf.state_dict() if k.endswith("tid2eid"))], table)  # seeded: the same table each time


def test_a_router_that_names_its_chosen_experts_is_counted_from_them():
    # Zaya's router scores through an MLP of its own (and one row more, a skip expert): no weight of
    # [n_experts, hidden] to find, but its output names the experts each token goes to
    from onboard.compat.tiny import tiny_config

    hf = build_upstream(tiny_config("zaya"), seed=0).model
    declared = features.declare(hf.config)
    probe = features.Probe(hf, declared)
    assert not probe.routers() and probe.choosers()
    tokens = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), probe:
        hf(input_ids=tokens)
    e, k = declared["experts"].config["n_experts"], declared["experts"].config["top_k"]
    assert set(probe.expert_counts) == set(probe.choosers())
    assert all(c.shape == (e,) and int(c.sum()) == 64 * k for c in probe.expert_counts.values())
