"""Expert parallelism on 4 gloo ranks: dp_shard = 4, ep = 2, so the 4 experts are split 2 ways
(ep) and each rank's 2 experts are sharded over edp = 2; equal to one plain process."""

from __future__ import annotations

import _world
import pytest
from _ep_cases import WORKER, assert_same, native_reference

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause


JOB = _world.job("ep_w4", 4, WORKER, lambda root: ["w4", str(root / "out")], __file__)


def test_dp_shard4_ep2_matches_one_process(request, tmp_path):
    res = _world.results(request, JOB)  # in the session's one 4-rank launch (_world.py)
    out, ranks = res.out, res.ranks
    got = ranks[0]["native"]
    assert all(r["native"]["loss"] == got["loss"] for r in ranks)
    # 2 experts per ep rank, each split over edp = 2 along its second dim
    assert got["expert_mesh"] == ["edp", "ep"] and got["expert_placements"] == ["S(1)", "S(0)"]
    assert got["expert_local_shape"] == [2, 32, 64]
    assert got["dropped"] == [0, 0, 0]
    assert_same(got, out / "grads_native4.pt", native_reference(tmp_path, 4))
