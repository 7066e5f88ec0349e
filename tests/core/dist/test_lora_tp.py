"""[lora] under tensor parallelism (fp32, the tiny Llama checkpoint, _lora_worker.py's tp modes): tp = 2 on
2 gloo ranks, with and without sequence parallel, and dp 2 x tp 2 with sequence parallel on 4. Each run's
step losses and grad norms are one process's on the same global batch, the same on every rank; only the
adapters and the saved head hold gradients and AdamW state, each adapter half split over tp as
titan_core/lora/tensor_parallel.py splits it beside its layer (the other half replicated); every rank's
merged weight stream, the merged export and the PEFT export (rank 0's) are one process's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import _world
import pytest
from _cases import GLOBAL_BATCH, curve, max_rel
from _lora_worker import STREAM_REL, lora_cfg, stream

from core_bounds import FSDP_GRAD_NORM_REL, FSDP_LOSS_REL
from hf_tiny import write_tiny_llama
from titan_core.measure.numerics import rel_l2
from titan_core.training.trainer import Trainer

pytest.importorskip("peft")
pytestmark = [pytest.mark.whole_machine, pytest.mark.hf, pytest.mark.slow]  # ranks meet at every collective

WORKER = Path(__file__).with_name("_lora_worker.py")
WORLDS = {"tp": 2, "tp_sp": 2, "dp_tp_sp": 4}
"""Each tensor-parallel mode of the worker and its world size."""
JOBS = {mode: _world.job(f"lora_{mode}", world, WORKER,
                         lambda root, mode=mode: [mode, str(root / "out"), str(write_tiny_llama(root / "llama"))],
                         __file__) for mode, world in WORLDS.items()}  # fmt: skip
ON_TP = {"wq.lora_A": "R", "wq.lora_B": "S(0)", "wv.lora_A": "R", "wv.lora_B": "S(0)",
         "w2.lora_A": "S(1)", "w2.lora_B": "R", "output.modules_to_save": "S(0)"}  # fmt: skip
"""Each trainable parameter's placement on the tp mesh (the mesh's last dimension): the half of an adapter on a
column-wise layer (q_proj, v_proj) that is split is B, on a row-wise one (down_proj) A; the saved head is split
by vocabulary as the head is."""
ADAPTED = ("q_proj.weight", "v_proj.weight", "down_proj.weight", "lm_head.weight")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The same 4 steps in one plain eager process on the whole global batch: its curve, merged stream,
    PEFT export, and the base checkpoint's tensors."""
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("lora_tp_one")
    ckpt = write_tiny_llama(root / "llama")  # the same seed's checkpoint as every scenario's
    export = f"--checkpoint.export_hf={root / 'adapter'}"
    trainer = Trainer(lora_cfg(ckpt, root / "out", "--parallelism.data_parallel=none", export,
                               batch_size=GLOBAL_BATCH), quiet=True)  # fmt: skip
    rows = trainer.train().metrics
    base = {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(f).items()}
    return curve(rows), stream(trainer), load_file(root / "adapter" / "adapter_model.safetensors"), base


@dataclass(frozen=True)
class Run:
    ranks: list[dict]
    records: Path
    """Where the worker wrote its streams and exports (OUT/<mode>)."""
    ckpt: Path


@pytest.fixture(params=list(WORLDS))
def run(request):
    res = _world.results(request, JOBS[request.param])
    return Run(res.ranks, res.out / request.param, res.folder / "llama")


def test_losses_and_grad_norms_are_one_processs(run, one_process):
    want = one_process[0]
    world = len(run.ranks)
    assert [r["world_size"] for r in run.ranks] == [world] * world
    assert all(r["weights_from"].startswith(f"loaded initial weights from {run.ckpt} (") for r in run.ranks)
    for rank in run.ranks[1:]:  # every rank computes the same loss and norm
        assert rank["loss"] == run.ranks[0]["loss"] and rank["grad_norm"] == run.ranks[0]["grad_norm"]
    assert max_rel(run.ranks[0]["loss"], want["loss"]) <= FSDP_LOSS_REL, (run.ranks[0]["loss"], want["loss"])
    assert max_rel(run.ranks[0]["grad_norm"], want["grad_norm"]) <= FSDP_GRAD_NORM_REL


def test_only_the_adapters_and_the_saved_head_train_each_split_as_its_layer(run):
    for rank in run.ranks:
        assert rank["grads"] == rank["optim"] and rank["grads"]
        assert set(rank["placements"]) == set(rank["grads"])  # nothing else trains
        for name, placements in rank["placements"].items():
            kind = next(k for k in ON_TP if f".{k}." in f".{name}")
            assert len(placements) == 2 and placements[-1] == ON_TP[kind], (name, placements)  # [dp_shard, tp]
        assert {k for k in ON_TP if any(f".{k}." in f".{n}" for n in rank["grads"])} == set(ON_TP)


def test_every_ranks_merged_stream_is_one_processs(run, one_process):
    import torch

    _, want, _, base = one_process
    assert {n for n in want if not torch.equal(want[n], base[n])} == {n for n in want if n.endswith(ADAPTED)}
    for r in range(len(run.ranks)):
        got = torch.load(run.records / f"stream_{r}.pt")
        assert list(got) == list(want)
        for name, t in got.items():
            assert rel_l2(t, want[name]) <= STREAM_REL, (r, name)


def test_the_merged_export_is_one_processs_stream(run, one_process):
    from safetensors.torch import load_file

    want = one_process[1]
    got = {k: v for f in sorted((run.records / "merged").glob("*.safetensors")) for k, v in load_file(f).items()}
    assert set(got) == set(want) and all(rel_l2(got[k], want[k]) <= STREAM_REL for k in want)


def test_the_peft_export_is_one_processs(run, one_process):
    from safetensors.torch import load_file

    want = one_process[2]
    got = load_file(run.records / "adapter" / "adapter_model.safetensors")
    assert list(got) == list(want) and any(".lora_B." in k for k in got)
    assert all(got[k].shape == want[k].shape and rel_l2(got[k], want[k]) <= STREAM_REL for k in want)


def test_the_merged_stream_holds_one_weight_beyond_the_shards(run):
    """As under SimpleFSDP alone (test_lora_two_ranks.py) each delta is brought to its weight's placements and
    added on the shards, and only the sum is gathered; but DTensor gathers a weight split on dim 1 over tp (a
    row-wise layer's) into one buffer and lays the chunks side by side in a second, while the sum's tp shard is
    still alive: twice the largest tensor plus its tp shard, under half the model's bytes."""
    for rank in run.ranks:
        s = rank["stream_peak"]
        bound = 2 * s["largest_bytes"] + s["largest_bytes"] // 2  # tp = 2
        assert 0 < s["peak_bytes"] <= bound < s["total_bytes"] / 2, s
