"""The transformers path (transformers' own LlamaForCausalLM in titan_core) at world size 2 with
gloo: SimpleFSDP shards every parameter of the decoder layers and FSDP2 makes each layer a unit;
both match one plain process on the same rows to the simple_fsdp gate's fp32 tolerance."""

from __future__ import annotations

from pathlib import Path

import _world
import pytest
from _cases import curve, max_rel

from core_bounds import FSDP_LOSS_REL
from titan_core.train import run

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.whole_machine, pytest.mark.hf, pytest.mark.slow]  # ranks meet at every collective: the background climbs pause

TOL = FSDP_LOSS_REL  # the simple_fsdp gate's fp32 bound (checklists/simple_fsdp.yaml step1_loss)
WORKER = Path(__file__).with_name("_transformers_fsdp_worker.py")


def _args(root: Path) -> list[str]:
    transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=128, vocab_size=256, max_position_embeddings=256).to_json_file(
        root / "config.json")  # fmt: skip
    return [str(root / "w2"), str(root / "config.json")]


JOB = _world.job("tf_fsdp", 2, WORKER, _args, __file__, out="w2")


@pytest.fixture(scope="module")
def runs(request):
    """(one plain process's curve, the ranks' results: the session's one 2-rank launch, _world.py)."""
    from _transformers_fsdp_worker import tf_cfg

    res = _world.results(request, JOB)
    cfg = tf_cfg(res.folder / "ref", str(res.folder / "config.json"), "--parallelism.data_parallel=none")
    return curve(run(cfg, quiet=True).metrics), res.ranks


@pytest.mark.parametrize("mode", ["simple_fsdp", "fsdp2"])
def test_two_ranks_match_one_process(runs, mode):
    ref, ranks = runs
    got = ranks[0][mode]
    assert got["world_size"] == 2 and got["all_params_sharded"] and got["block_params"] == 18
    assert ranks[0][mode]["loss"] == ranks[1][mode]["loss"]
    assert max_rel(got["loss"], ref["loss"]) <= TOL
    assert max_rel(got["grad_norm"], ref["grad_norm"]) <= TOL
    if mode == "fsdp2":
        assert got["blocks_are_fsdp_units"] and got["block_classes"] == ["FSDPLlamaDecoderLayer"]
    else:
        assert not got["blocks_are_fsdp_units"] and got["block_classes"] == ["LlamaDecoderLayer"]
