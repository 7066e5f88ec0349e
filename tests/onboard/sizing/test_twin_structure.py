"""What a twin keeps that parity needs (onboard/sizing/twin/heads.py, twin/kept_layers.py): the heads'
layout (2 key/value heads and the GQA ratio, head_dim, at the same width for every family), one
layer of each kind of a pattern that is not periodic, a working twin of a config whose head_dim is
null, and features counted as exercised only where the twin holds them (onboard/parity/features.py
`not_held`), a GQA ratio a --twin-width could not keep among them.
"""

from __future__ import annotations

import json

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.sizing.twin.derive import TwinError, derive_twin
from onboard.sizing.twin.kept_layers import layer_kinds
from real_size_configs import GEMMA2_9B, MIXTRAL, PUBLISHED
from titan_core.models import get_family

LLAMA = get_family("llama3").adapter


def llama(heads: int, kv: int) -> dict:
    """Llama-3.1-8B's config.json with another head layout (head_dim derived: 4096 / heads)."""
    return {**PUBLISHED["Llama-3.1-8B"][2], "num_attention_heads": heads, "num_key_value_heads": kv}


@pytest.mark.parametrize(
    "cfg, heads, kv, dim",
    [
        (llama(32, 8), 8, 2, 256),  # GQA 4: kept, with 2 key/value heads; head_dim written, the width free
        (PUBLISHED["Qwen3-0.6B"][2], 4, 2, 256),  # GQA 2 (16:8), width free
        (llama(32, 32), 2, 2, 256),  # MHA stays MHA
        (llama(32, 1), 32, 1, 256),  # MQA keeps its one key/value head and its 32 query heads (the ratio)
        (PUBLISHED["Llama-3.1-70B"][2], 16, 2, 256),  # GQA 8 of 128: kept as 16:2, at the common width
    ],
    ids=["32:8", "16:8", "MHA", "MQA", "64:8"],
)
def test_heads_keep_their_layout_and_the_gqa_ratio(cfg, heads, kv, dim):
    family = "qwen3" if cfg["model_type"] == "qwen3" else "llama3"
    twin = derive_twin(cfg, get_family(family).adapter)
    a, full = twin.args, twin.full_args
    assert (a.n_heads, a.n_kv_heads, a.dim, a.head_dim) == (heads, kv, dim, full.head_dim)
    assert twin.config["head_dim"] == full.head_dim  # explicit in the twin, where the full config derives it
    rows = {r.field: r for r in twin.rows}
    assert rows["GQA ratio"].twin == f"{heads}:{kv}" and rows["GQA ratio"].full == f"{full.n_heads}:{full.n_kv_heads}"
    why = next((rows[f].why for f in ("num_key_value_heads", "num_attention_heads") if f in rows), None)
    ratio = full.n_heads // full.n_kv_heads
    assert heads // kv == ratio and "not kept" not in rows["GQA ratio"].why
    if full.n_kv_heads == full.n_heads:
        assert why.startswith("MHA kept")
    elif full.n_kv_heads == 1:  # every head kept: no heads row, the GQA row says what the twin holds
        assert why is None and rows["GQA ratio"].why == f"MQA, {ratio} query heads a key/value head"
    else:
        assert f"GQA ratio {ratio} kept with 2 key/value heads" in why


def test_a_family_deriving_head_dim_regardless_keeps_the_ratio_at_the_narrowest_width():
    # 64:8 of 128 where hidden_size sets head_dim whatever the config says: 16:2 is 2048 wide, and the row says why
    cfg = PUBLISHED["Llama-3.1-70B"][2]
    twin = derive_twin(cfg, DerivingAdapter())
    a, rows = twin.args, {r.field: r for r in twin.rows}
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.dim) == (16, 2, 128, 2048) and "head_dim" not in twin.config
    assert "narrowest width that keeps the GQA ratio 8" in rows["hidden_size"].why
    # a --twin-width such a family cannot split with the ratio shrinks it: the heads' and the GQA rows say so
    small = derive_twin(cfg, DerivingAdapter(), width=768)
    rows = {r.field: r for r in small.rows}
    assert (small.args.n_heads, small.args.n_kv_heads) == (6, 2)
    assert "GQA ratio 8 shrunk to 3" in rows["num_key_value_heads"].why
    assert "--twin-width 2048 keeps it" in rows["num_key_value_heads"].why
    assert rows["GQA ratio"].twin == "6:2" and "ratio 8 is not kept" in rows["GQA ratio"].why
    assert "gqa_ratio" in rows["GQA ratio"].why  # what parity will name (test below)


def test_a_dense_layer_listed_deep_in_an_moe_model_is_kept():
    # Qwen3-30B-A3B with two dense layers at 5 and 17 (no period): the first 2 layers are MoE
    cfg = {**PUBLISHED["Qwen3-30B-A3B"][2], "mlp_only_layers": [5, 17]}
    twin = derive_twin(cfg, get_family("qwen3_moe").adapter)
    assert twin.layers == [0, 1, 5] and twin.config["mlp_only_layers"] == [2]
    assert [twin.args.layer_is_moe(i) for i in range(3)] == [True, True, False]
    full_kinds = layer_kinds(twin.full_args, cfg)
    assert layer_kinds(twin.args, twin.config) == [full_kinds[i] for i in twin.layers]
    rows = {r.field: r for r in twin.rows}
    assert rows["num_hidden_layers"].twin == 3 and "layers 5 added" in rows["num_hidden_layers"].why
    assert (rows["layer kinds"].full, rows["layer kinds"].twin) == ("MoE x46, dense x2", "MoE x2, dense x1")


@pytest.mark.hf
def test_sliding_layers_listed_one_by_one_are_held_by_the_twin():
    pytest.importorskip("transformers", reason="the transformers path reads the config through its class")
    from onboard.parity import features
    from titan_core.models.transformers.hf_classes import config_object

    types = ["full_attention"] * 28
    for i in (3, 9, 20):  # not periodic: the args read every layer as global
        types[i] = "sliding_attention"
    cfg = {**PUBLISHED["Qwen2.5-7B"][2], "layer_types": types, "use_sliding_window": True, "sliding_window": 4096}
    twin = derive_twin(cfg, get_family("transformers").adapter)
    assert twin.layers == [0, 1, 3]
    assert twin.config["layer_types"] == ["full_attention", "full_attention", "sliding_attention"]
    assert twin.config["sliding_window"] == 64  # a 512-token parity sequence crosses it
    rows = {r.field: r for r in twin.rows}
    assert rows["layer kinds"].twin == "full_attention x2, sliding_attention x1"
    # parity declares features from what the twin holds: its one sliding layer
    held = features.declare(config_object(twin.config))
    assert held["sliding_window"].declared and held["sliding_window"].config == {"window": 64}
    assert features.not_held(held, config_object(cfg), "the twin") == []
    # a twin cut to its first layers (as before) holds no sliding layer: the feature is declared, never exercised
    cut = {**twin.config, "layer_types": types[:3], "num_hidden_layers": 3}
    dropped = features.declare(config_object(cut))
    assert not dropped["sliding_window"].declared
    assert features.not_held(dropped, config_object(cfg), "the twin (twin.json)") == ["sliding_window"]
    assert not features.exercised(dropped)
    assert features.idle(dropped) == [
        "sliding_window (the full model's config.json declares it, the twin (twin.json) does not hold it: no parity "
        "pass ran it)"
    ]


def test_a_null_head_dim_gets_a_working_twin_by_default():
    # the port path reads Mixtral with its closest family's adapter; head_dim null means hidden_size / heads,
    # and MixtralConfig (like the adapter) reads an explicit one: the twin says 128 and is 256 wide
    twin = derive_twin(MIXTRAL, LLAMA)
    assert (twin.args.n_heads, twin.args.n_kv_heads, twin.args.head_dim, twin.args.dim) == (8, 2, 128, 256)
    assert twin.config["head_dim"] == 128 and twin.config["hidden_size"] == 256
    # a width that is not a multiple of 16 is refused, naming the widths that work
    with pytest.raises(TwinError, match=r"^--twin-width 1000: .*multiples of 16.*e\.g\. --twin-width 992, 1008$"):
        derive_twin(MIXTRAL, LLAMA, width=1000)
    assert derive_twin(MIXTRAL, LLAMA, width=512).args.n_heads == 8  # 8:2: the width does not set the heads
    # where the family derives head_dim whatever the config says, a width the heads cannot split is refused,
    # naming the widths that work
    with pytest.raises(TwinError, match=r"^--twin-width 1000: .*head_dim 128.*e\.g\. --twin-width 768, 1024$"):
        derive_twin(MIXTRAL, DerivingAdapter(), width=1000)
    assert derive_twin(MIXTRAL, DerivingAdapter(), width=512).args.n_heads == 4  # 4:2, the row says what keeps 4


class DerivingAdapter:
    """A workspace adapter that derives head_dim from hidden_size whatever the config says."""

    def args_from_hf(self, cfg):
        args, used = LLAMA.args_from_hf({**cfg, "head_dim": None})
        return args, used


def test_a_twin_the_adapter_reads_with_another_head_dim_names_the_width_that_fixes_it():
    cfg = {**PUBLISHED["Llama-3.1-8B"][2], "head_dim": 128}  # explicit, so the derivation takes the width as free
    with pytest.raises(TwinError, match=r"head_dim.*--twin-width 1024 keeps head_dim 128"):
        derive_twin(cfg, DerivingAdapter(), width=256)
    assert derive_twin(cfg, DerivingAdapter(), width=1024).args.head_dim == 128


def test_new_model_refuses_an_unsplittable_width_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    argv = ["new-model", "mx", "--hf-config", str(tmp_path / "config.json"), "--dir", str(tmp_path), "--device", "cpu",
            "--path", "port", "--twin-width", "1000"]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--twin-width 992, 1008" in lines[0], result.stderr
    assert not (tmp_path / "onboarding" / "mx").exists()


PRODUCTION = {
    **{name: (PUBLISHED[name][0], PUBLISHED[name][2], heads)
       for name, heads in (("Qwen3-8B", (8, 2)), ("Qwen3-235B-A22B", (32, 2)), ("Llama-3.1-70B", (16, 2)),
                           ("Llama-3.2-1B", (8, 2)))},
    "Mixtral-8x7B": ("llama3", MIXTRAL, (8, 2)),
    "Gemma-2-9B": ("transformers", GEMMA2_9B, (4, 2)),
}  # fmt: skip
"""name: (family, config.json, the default twin's (query heads, key/value heads))."""


@pytest.mark.parametrize("name", list(PRODUCTION))
def test_production_twins_keep_the_gqa_ratio_at_a_common_width(name):
    family, cfg, heads = PRODUCTION[name]
    if family == "transformers":
        pytest.importorskip("transformers", reason="the transformers path reads the config through its class")
    adapter = get_family(family).adapter
    twin = derive_twin(cfg, adapter)
    a, full = twin.args, twin.full_args
    assert (a.n_heads, a.n_kv_heads) == heads
    assert a.n_heads // a.n_kv_heads == full.n_heads // full.n_kv_heads and a.n_heads % a.n_kv_heads == 0
    assert a.head_dim == full.head_dim
    assert a.n_kv_heads >= (1 if full.n_kv_heads == 1 else 2)
    assert a.dim % 16 == 0 and a.dim <= 1024 and a.dim == 256  # every family equally wide
    assert a.ffn_hidden_dim % 16 == 0 and a.moe_hidden_dim % 16 == 0
    # twin.json as new-model writes it reads back through the family's adapter to the same args
    assert adapter.args_from_hf(json.loads(json.dumps(twin.config)))[0] == a
    rows = {r.field: r for r in twin.rows}
    assert rows["GQA ratio"].twin == f"{heads[0]}:{heads[1]}" and "not kept" not in rows["GQA ratio"].why
    if name == "Qwen3-235B-A22B":  # the MoE rules are the heads' neighbours, unchanged
        assert (a.n_experts, a.top_k, a.moe_hidden_dim) == (16, 8, 96)


@pytest.mark.hf
def test_parity_names_a_gqa_ratio_the_twin_does_not_hold():
    pytest.importorskip("transformers", reason="parity declares features from transformers' config class")
    from onboard.parity import features
    from titan_core.models.transformers.hf_classes import config_object

    cfg = PUBLISHED["Llama-3.1-70B"][2]
    full = config_object(cfg)
    kept = derive_twin(cfg, LLAMA).config  # 16:2: the ratio 8 held
    held = features.declare(config_object(kept))
    assert features.not_held(held, full, "the twin (twin.json)", config_object(kept)) == []
    assert features.exercised(held)
    lost = derive_twin(cfg, DerivingAdapter(), width=768).config  # 6:2: the ratio 3
    dropped = features.declare(config_object(lost))
    assert features.not_held(dropped, full, "the twin (twin.json)", config_object(lost)) == ["gqa_ratio"]
    assert not features.exercised(dropped)
    assert features.idle(dropped) == [
        "gqa_ratio (full 64:8, twin 6:2: the twin's key/value expansion groups differ; the twin (twin.json) does "
        "not hold the full model's GQA ratio, no parity pass ran it)"
    ]
    assert dropped["gqa_ratio"].as_dict()["full"] == "64:8" and dropped["gqa_ratio"].as_dict()["twin"] == "6:2"
