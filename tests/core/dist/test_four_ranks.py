"""Four gloo ranks (in the session's one 4-rank launch: _world.py): HSDP on a 2 x 2 mesh, and SimpleFSDP 2 x TP 2."""

from __future__ import annotations

from pathlib import Path

import _world
import pytest
from _cases import DENSE, HSDP, max_rel, param_reads_per_forward

from core_bounds import FSDP_LOSS_REL

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause

TOL = FSDP_LOSS_REL  # the simple_fsdp gate's fp32 bound (checklists/simple_fsdp.yaml step1_loss)


JOB = _world.job("w4", 4, Path(__file__).with_name("_worker.py"), lambda root: ["w4", str(root / "out")], __file__)


@pytest.fixture(scope="module")
def w4(request):
    """_worker.py's w4 scenario, in the session's one 4-rank launch (_world.py)."""
    return _world.results(request, JOB).ranks


@pytest.mark.parametrize("family", HSDP)
def test_hsdp_2x2_matches_one_process(w4, reference, family):
    got, want = w4[0]["hsdp"][family], reference(family, dp=4)
    assert got["mode"] == "hybrid_shard" and got["mesh"] == ["dp_replicate", "dp_shard"]
    assert all(rank["hsdp"][family]["loss"] == got["loss"] for rank in w4)
    assert max_rel(got["loss"], want["loss"]) <= TOL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= TOL


def test_flux_hsdp_2x2_matches_one_process(w4, flux_reference):
    got = w4[0]["flux_hsdp"]
    assert got["mode"] == "hybrid_shard" and got["mesh"] == ["dp_replicate", "dp_shard"]
    assert max_rel(got["loss"], flux_reference["loss"]) <= TOL
    assert max_rel(got["grad_norm"], flux_reference["grad_norm"]) <= TOL


@pytest.mark.parametrize("family", HSDP)
def test_hsdp_shards_within_and_replicates_across(w4, family):
    got = w4[0]["hsdp"][family]
    for name, g in got["grads"].items():
        assert g["param"] == ["R", "S(0)"] and g["grad"] == ["R", "S(0)"] and g["local_shapes_match"], name
    # as fully_shard within a group (the valid-token count over all 4 data-parallel ranks is one
    # all-reduce), plus one all-reduce per gradient across the two groups
    reads = param_reads_per_forward(family)
    assert got["comm"] == {
        "all_gather_into_tensor": reads,
        "reduce_scatter_tensor": reads,
        "all_reduce": reads + 3,
    }


@pytest.mark.parametrize("family", DENSE)
def test_simple_fsdp_2_x_tp_2_matches_one_process(w4, reference, family):
    got, want = w4[0]["dp_tp"][family], reference(family, dp=2)
    assert all(rank["dp_tp"][family]["loss"] == got["loss"] for rank in w4)
    assert max_rel(got["loss"], want["loss"]) <= TOL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= TOL
    grads = got["grads"]
    # column-parallel weights: TP splits rows (dim 0), so SimpleFSDP shards columns (dim 1); row-parallel: the reverse
    assert grads["layers.0.attention.wq.weight"]["param"] == ["S(1)", "S(0)"]
    assert grads["layers.0.attention.wo.weight"]["param"] == ["S(0)", "S(1)"]
    assert grads["layers.0.feed_forward.w2.weight"]["param"] == ["S(0)", "S(1)"]
    assert grads["layers.0.ffn_norm.weight"]["param"] == ["S(0)", "R"]
    # the vocabulary split over TP (rows), the width over dp_shard: a quarter of the embedding and head per rank
    tables = ["tok_embeddings.weight"] + (["output.weight"] if family != "glimmer" else [])  # glimmer ties its head
    for name in tables:
        assert grads[name]["param"] == ["S(1)", "S(0)"], name
    assert all(g["grad"] == g["param"] and g["local_shapes_match"] for g in grads.values())


def test_fsdp2_hsdp_matches_one_process(w4, reference):
    got = w4[0]["fsdp2_hsdp"]
    assert max_rel(got["loss"], reference("llama3", dp=4)["loss"]) <= TOL
    assert max_rel(got["grad_norm"], reference("llama3", dp=4)["grad_norm"]) <= TOL
    assert all(g["param"] == ["R", "S(0)"] and g["grad"] == ["R", "S(0)"] for g in got["grads"].values())


def test_simple_fsdp_2_x_tp_2_with_sequence_parallel_matches(w4, reference):
    got, want = w4[0]["dp_tp_sp"], reference("qwen3", dp=2)
    assert max_rel(got["loss"], want["loss"]) <= TOL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= TOL
    assert all(g["grad"] == g["param"] and g["local_shapes_match"] for g in got["grads"].values())
