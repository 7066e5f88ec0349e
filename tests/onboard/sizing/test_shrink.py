"""The rules a twin and a compat tiny config share (onboard/sizing/shrink.py): a size only shrinks,
the layers kept are the first of each kind in step with the pattern's period, token ids move into the
small vocabulary by the caller's rule, and both find a size under the HF-name table's names."""

from __future__ import annotations

from onboard.compat import tiny
from onboard.sizing.shrink import entries_of, first_of_each_kind, moved_token_ids, renumbered, shrinks, shrunk
from titan_core.config.hf_keys import HF_KEYS


def test_a_size_only_shrinks_and_no_feature_is_added():
    assert shrunk(4096, 256) == 256 and shrunk(128, 256) == 128
    assert shrunk(0, 4) == 0 and shrunk(True, 0) is True  # a count of 0 stays; a flag is no size
    assert shrunk(None, 32) is None  # no window: none added
    assert shrinks(None, 16, derived=True)  # a head_dim the class derives is set


def test_the_first_of_each_kind_in_step_with_the_period():
    # sliding/full every 2nd layer, one odd layer (9) the first two do not hold
    kinds = [(i % 2, i == 9) for i in range(12)]
    kept = first_of_each_kind(kinds, range(2), period=2)
    assert kept == [0, 1, 8, 9]  # layer 8 leads in so that 9 sits at an odd place, as in the full model
    assert all(p % 2 == j % 2 for p, j in enumerate(kept))
    assert first_of_each_kind(["x", "x", "y", "x", "z"]) == [0, 2, 4]  # a tiny config's choice: no period


def test_per_layer_lists_follow_the_kept_layers():
    kept = [0, 1, 8, 9]
    assert entries_of([f"t{i}" for i in range(12)], kept) == ["t0", "t1", "t8", "t9"]
    assert renumbered([5, 9], kept) == [3]  # mlp_only_layers: old layer 9 is kept layer 3


def test_token_ids_move_by_the_callers_rule():
    cfg = {"bos_token_id": 151643, "eos_token_id": [7, 151645], "pad_token_id": None, "vocab_size": 151936}
    distance = moved_token_ids(cfg, lambda t: t - 151936 + 2048 if isinstance(t, int) and t >= 2048 else t)
    assert distance == {"bos_token_id": 1755, "eos_token_id": [7, 1757]}  # the twin's: as far from the end
    last = moved_token_ids(cfg, lambda t: 255 if isinstance(t, int) and t > 255 else t)
    assert last == {"bos_token_id": 255, "eos_token_id": [7, 255]}  # a tiny config's: its last id


def test_the_tiny_config_knows_every_name_the_table_gives_a_size():
    sizes = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_hidden_dim", "max_seq_len",
             "sliding_window", "n_experts", "top_k", "moe_hidden_dim", "shared_expert_hidden_dim")  # fmt: skip
    for field in sizes:
        assert set(HF_KEYS[field]) <= set(tiny.SIZES), field
        assert len({tiny.SIZES[k] for k in HF_KEYS[field]}) == 1, field  # every name of it gets one tiny value
