"""Graph Trainer under SimpleFSDP on 2 processes: bit-identical to eager, collectives in the graph."""

import sys
from pathlib import Path

import pytest
from _gt_dist_worker import FAMILIES

sys.path.insert(0, str(Path(__file__).parents[1] / "dist"))  # _world: the session's one launch per world size
import _world  # noqa: E402

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause

JOB = _world.job("graph_trainer", 2, Path(__file__).with_name("_gt_dist_worker.py"), lambda root: [str(root / "out")],
                 __file__)  # fmt: skip


@pytest.fixture(scope="module")
def ranks(request):
    """The ranks' results, from the session's one 2-rank launch (tests/core/dist/_world.py): a launch of
    its own cost every rank seconds of start-up (torchrun, the imports) beside its minute of work."""
    return _world.results(request, JOB).ranks


@pytest.mark.parametrize("family", FAMILIES)
def test_two_ranks_bit_identical_to_eager(ranks, family):
    for r in ranks:
        res = r[family]
        assert res["data_parallel"] == "simple_fsdp" and res["mesh_mode"] == "fully_shard"
        assert res["graph_loss"] == res["eager_loss"] and res["graph_norm"] == res["eager_norm"]
        assert res["params_equal"]
        assert res["programs_per_step"] == [1, 1, 1]
        # the sharding collectives are nodes of the captured graph, not hidden in hooks
        assert res["all_gathers"] > 0 and res["reduce_scatters"] > 0
    assert ranks[0][family]["eager_loss"] == ranks[1][family]["eager_loss"]  # the global (all-reduced) loss
    assert ranks[0][family]["local_shard_shapes"][0][0] == 128  # vocab 256 sharded over 2 ranks


def test_two_ranks_scan_over_layers(ranks):
    for r in ranks:
        assert r["scan"]["graph_loss"] == r["scan"]["eager_loss"] and r["scan"]["params_equal"]
