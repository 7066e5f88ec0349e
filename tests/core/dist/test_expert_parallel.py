"""Expert parallelism (titan_core/parallel/expert_parallel.py) against one plain process.

2 gloo ranks (_ep_worker.py, in the session's one 2-rank launch: _world.py) at ep = 2 (each rank holds
2 of the 4 experts, whole): the native qwen3_moe, the same with a capacity that drops rows, the
transformers path's Qwen3-MoE, a dense model refused (4 ranks: test_expert_parallel_four_ranks.py).
References: the same rows in one process as dp micro-batches accumulated (the load-balancing
loss is per forward pass: tests/core/dist/conftest.py), fp32, same seed. The refusals run here.
"""

from __future__ import annotations

import math
from pathlib import Path

import _world
import pytest
from _cases import GLOBAL_BATCH, max_rel, tiny_cfg
from _ep_cases import LOSS_TOL, WORKER, assert_same, native_reference, one_process
from _ep_worker import STEPS
from _transformers_fsdp_worker import tf_cfg

from titan_core.config.loader import ConfigError
from titan_core.models import build_meta, resolve_args
from titan_core.parallel import check_parallelism
from titan_core.parallel.expert_parallel import check_expert_model
from titan_core.train import main

HAS_TRANSFORMERS = True
try:
    import transformers
except ImportError:
    HAS_TRANSFORMERS = False


def _hf_config(root: Path) -> str:
    """The transformers Qwen3-MoE's config.json, "-" without transformers."""
    if not HAS_TRANSFORMERS:
        return "-"
    transformers.Qwen3MoeConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, vocab_size=256,
        max_position_embeddings=256, norm_topk_prob=True,
    ).to_json_file(root / "qwen3_moe.json")  # fmt: skip
    return str(root / "qwen3_moe.json")


JOB = _world.job("ep_w2", 2, WORKER, lambda root: ["w2", str(root / "out"), _hf_config(root)], __file__)


@pytest.fixture(scope="module")
def w2(request):
    """(its folder, the transformers config or "-", the ranks' results): _ep_worker.py's w2 scenario, in the
    session's one 2-rank launch (_world.py)."""
    res = _world.results(request, JOB)
    hf_config = str(res.folder / "qwen3_moe.json") if HAS_TRANSFORMERS else "-"
    return res.folder, hf_config, res.ranks


@pytest.mark.whole_machine
def test_ep2_matches_one_process(w2, tmp_path):
    root, _, ranks = w2
    got = ranks[0]["native"]
    assert all(r["native"]["loss"] == got["loss"] for r in ranks)
    # 2 of the 4 experts per rank, whole (edp = 1: no dimension)
    assert got["expert_mesh"] == ["ep"] and got["expert_placements"] == ["S(0)"]
    assert got["expert_shape"] == [4, 64, 64] and got["expert_local_shape"] == [2, 64, 64]
    assert got["dropped"] == [0] * STEPS
    assert_same(got, root / "out" / "grads_native.pt", native_reference(tmp_path, 2))


@pytest.mark.whole_machine
def test_other_experts_kernels_under_ep2(w2):
    ranks = w2[2]
    want = ranks[0]["native"]["loss"][:2]
    for moe, got in ranks[0]["kernels"].items():
        assert max_rel(got, want) <= LOSS_TOL, (moe, got, want)


@pytest.mark.whole_machine
def test_capacity_drops_and_counts(w2):
    _, _, ranks = w2
    got, dropless = ranks[0]["capacity"], ranks[0]["native"]
    assert all(r["capacity"]["dropped"] == got["dropped"] for r in ranks)
    # per rank and layer: 64 tokens x top 2 = 128 rows over 4 experts, at most 16 kept per expert,
    # so at least 64 of 128 dropped; 2 ranks x 2 MoE layers
    assert all(2 * 2 * 64 <= d < 2 * 2 * 128 for d in got["dropped"]), got["dropped"]
    assert all(math.isfinite(x) for x in got["loss"] + got["grad_norm"])
    assert got["loss"][0] != dropless["loss"][0]  # the dropped rows' expert outputs are gone


@pytest.mark.whole_machine
@pytest.mark.hf
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="the transformers path needs the [hf] extra (transformers)")
def test_transformers_qwen3_moe_ep2_matches_ep1(w2, tmp_path):
    root, hf_config, ranks = w2
    got = ranks[0]["transformers"]
    assert got["expert_shape"] == [4, 128, 64] and got["expert_local_shape"] == [2, 128, 64]  # gate_up_proj [E, 2I, D]
    assert got["dropped"] == [0] * STEPS
    ref = one_process(tf_cfg(tmp_path, hf_config, "--parallelism.data_parallel=none", "--training.grad_accum=2",
                              batch_size=GLOBAL_BATCH // 2, steps=STEPS))  # fmt: skip
    assert_same(got, root / "out" / "grads_transformers.pt", ref)


@pytest.mark.whole_machine
def test_dense_model_refused_at_ep2(w2):
    msg = w2[2][0]["dense_refused"]
    assert msg is not None and "parallelism.ep = 2" in msg and "no experts" in msg


def _cfg(*extra: str, family: str = "qwen3_moe"):
    return tiny_cfg(family, Path("unused"), *extra)


@pytest.mark.parametrize(
    ("extra", "world", "says"),
    [
        (("--parallelism.ep=2", "--parallelism.data_parallel=fsdp2"), 2, "simple_fsdp' only"),
        # ep with tp runs (tests/core/dist/test_compose.py); with sequence parallel the MoE layers would route a part
        (("--parallelism.ep=2", "--parallelism.tp=2", "--parallelism.dp_shard=2", "--parallelism.sequence_parallel"), 4,
         "set sequence_parallel = false"),
        (("--parallelism.ep=2", "--graph_trainer.enable"), 2, "graph_trainer.enable = false"),
        (("--parallelism.ep_capacity_factor=0.5",), 1, "only ep > 1 has"),
        (("--parallelism.ep=4",), 2, "must divide dp_shard x cp"),
    ],
)
def test_check_parallelism_refuses(extra, world, says):
    with pytest.raises(ConfigError, match=says):
        check_parallelism(_cfg(*extra), world)


def test_model_refusals():
    dense = build_meta("llama3", resolve_args("llama3", "debugmodel", {"n_layers": 1}))
    with pytest.raises(ConfigError, match="no experts"):
        check_expert_model(dense, 2)
    three = build_meta("qwen3_moe", resolve_args("qwen3_moe", "debugmodel", {"n_layers": 1, "n_experts": 3}))
    with pytest.raises(ConfigError, match="must divide the model's n_experts = 3"):
        check_expert_model(three, 2)
    assert len(check_expert_model(three, 3)) == 1


def test_refusal_exits_2(tmp_path, capsys):
    assert main(["--model.family=qwen3_moe", "--parallelism.ep_capacity_factor=0.5", "--device.type=cpu",
                 f"--metrics.output_dir={tmp_path}"]) == 2  # fmt: skip
    assert "ep_capacity_factor" in capsys.readouterr().err
