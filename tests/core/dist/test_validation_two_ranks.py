"""Validation at world size 2 (gloo): the held-out loss of SimpleFSDP, FSDP2 and TP = 2 ranks equals
one plain process's on the same held-out batches (the simple_fsdp gate's fp32 bound), and a
SimpleFSDP run logs it at the steps one process does."""

from __future__ import annotations

from pathlib import Path

import _world
import pytest
from held_out_data import make_cfg, write_corpus

from core_bounds import FSDP_LOSS_REL
from titan_core.measure.numerics import rel
from titan_core.training.trainer import Trainer

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause

WORKER = Path(__file__).with_name("_validation_worker.py")


JOB = _world.job("validation", 2, WORKER, lambda root: [str(root / "w2"), str(write_corpus(root))], __file__,
                 out="w2")  # fmt: skip


@pytest.fixture(scope="module")
def runs(request):
    """(one plain process's validation, the ranks' results: the session's one 2-rank launch, _world.py)."""
    res = _world.results(request, JOB)
    root = res.folder
    one = Trainer(make_cfg(root, steps=3, freq=2, out=root / "one"), quiet=True)
    ref = {"untrained": one.validator.run(one.model), "rows": one.train().metrics}
    return ref, res.ranks


@pytest.mark.parametrize("mode", ["simple_fsdp", "fsdp2", "tp"])
def test_two_ranks_validate_as_one_process(runs, mode):
    ref, ranks = runs
    want = ref["untrained"]
    for rank in ranks:  # every rank holds the reduced value
        got = rank[mode]["untrained"]
        assert got["val_tokens"] == want["val_tokens"] > 0
        assert rel(got["val_loss"], want["val_loss"]) <= FSDP_LOSS_REL, (mode, got, want)
    assert ranks[0][mode]["dp_world"] == (1 if mode == "tp" else 2)


def test_a_simple_fsdp_run_logs_validation_at_the_same_steps(runs):
    ref, ranks = runs
    assert ranks[0]["simple_fsdp"]["mode"] == "fully_shard"
    rows = ranks[0]["simple_fsdp"]["rows"]
    assert rows == ranks[1]["simple_fsdp"]["rows"]
    assert [r["step"] for r in rows if r["val_loss"] is not None] == [2, 3]
    for got, want in zip(rows, ref["rows"]):
        assert got["val_tokens"] == want.get("val_tokens")
        if got["val_loss"] is not None:
            assert rel(got["val_loss"], want["val_loss"]) <= FSDP_LOSS_REL, (got, want)
