"""Graph Trainer under SimpleFSDP on 2 processes: bit-identical to eager, collectives in the graph."""

import json
import sys
from pathlib import Path

import pytest
from _gt_dist_worker import FAMILIES
from hang_guard import guarded_launch

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("gt_dist")
    worker = Path(__file__).with_name("_gt_dist_worker.py")
    result = guarded_launch(
        [sys.executable, str(worker), str(out)], 2, 600, "_gt_dist_worker.py on 2 ranks", log_dir=out / "logs"
    )
    assert result.exit_code == 0, result.failure
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(2)]


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
