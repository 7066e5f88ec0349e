"""The transformers path (transformers' own LlamaForCausalLM in titan_core) at world size 2 with
gloo: SimpleFSDP shards every parameter of the decoder layers and FSDP2 makes each layer a unit;
both match one plain process on the same rows to the simple_fsdp gate's fp32 tolerance."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _cases import curve, max_rel
from hang_guard import guarded_launch

from core_bounds import FSDP_LOSS_REL
from titan_core.train import run

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.whole_machine, pytest.mark.hf, pytest.mark.slow]  # ranks meet at every collective: the background climbs pause

TOL = FSDP_LOSS_REL  # the simple_fsdp gate's fp32 bound (checklists/simple_fsdp.yaml step1_loss)
WORKER = Path(__file__).with_name("_transformers_fsdp_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    sys.path.insert(0, str(WORKER.parent))
    from _transformers_fsdp_worker import tf_cfg

    root = tmp_path_factory.mktemp("tf_fsdp")
    cfg_path = root / "config.json"
    transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=128, vocab_size=256, max_position_embeddings=256).to_json_file(cfg_path)  # fmt: skip
    ref = curve(run(tf_cfg(root / "ref", str(cfg_path), "--parallelism.data_parallel=none"), quiet=True).metrics)
    out = root / "w2"
    out.mkdir()
    result = guarded_launch(
        [sys.executable, str(WORKER), str(out), str(cfg_path)],
        2,
        300,
        "_transformers_fsdp_worker.py on 2 ranks",
        log_dir=out / "logs",
    )
    assert result.exit_code == 0, result.failure
    return ref, [json.loads((out / f"rank_{r}.json").read_text()) for r in range(2)]


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
