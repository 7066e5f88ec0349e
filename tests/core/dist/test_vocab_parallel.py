"""TP = 2 with the vocabulary split (titan_core/parallel/vocab_parallel.py): the token embedding by rows,
the output head by columns, the loss on the vocab-sharded logits, against one plain process.

Two gloo ranks (in the session's one 2-rank launch: _world.py), both one TP group, run every case of
_vocab_cases.py (untied and tied heads, with and without sequence parallel, the plain loss and fused_ce,
z-loss and glimmer's soft-cap) for 3 steps; one plain eager process runs each on the same rows. Step 1's
loss and grad norm are held to the simple_fsdp gate's fp32 bound (FSDP_*_REL), every parameter's whole
step-1 gradient and the 3-step loss and grad-norm curves to the kernels gate's (a loss head computed
another way: KERNEL_FP32_REL), as are `forward`'s logits before training (gathered whole from the slices);
each rank stores half of the embedding and head, and titan_core's memory estimate counts what it stores.

Why the later steps get the looser bound and no per-parameter check: AdamW's first update is about
lr x sign(g) per entry, so rounding-level differences in near-zero entries become lr-sized weight
differences, and step 2's gradients differ by ~1e-5 however the loss was summed (two loss heads in one
process, plain and fused_ce, do the same: 5e-7 at step 1, 1e-5 at step 2 on glimmer).
"""

from __future__ import annotations

from pathlib import Path

import _world
import pytest
import torch
from _cases import max_rel
from _vocab_cases import CASES, STEPS, case_cfg, probe_tokens
from torch import nn

from core_bounds import FSDP_GRAD_NORM_REL, FSDP_LOSS_REL, KERNEL_FP32_REL
from titan_core.config import ConfigError
from titan_core.measure.numerics import rel_l2
from titan_core.memory.estimate import ModelShape, TrainSetup, estimate_memory
from titan_core.parallel import resolve_degrees
from titan_core.parallel.vocab_parallel import VocabParallelLoss
from titan_core.models.model_builder import build_model_from_config
from titan_core.training.trainer import Trainer

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause

WORKER = Path(__file__).with_name("_vocab_worker.py")


JOB = _world.job("vocab", 2, WORKER, lambda root: [str(root / "out")], __file__)


@pytest.fixture(scope="module")
def ranks(request):
    """(the folder of its files, the ranks' results), from the session's one 2-rank launch (_world.py)."""
    res = _world.results(request, JOB)
    return res.out, res.ranks


def _one_process(name: str, out: Path) -> tuple[dict, dict, torch.Tensor]:
    """The case's curve in one plain process, its step-1 gradients and its logits before training."""
    t = Trainer(case_cfg(name, out, tp=False), quiet=True)
    with torch.no_grad():
        logits = t.model(probe_tokens())
    rows, grads = [], {}
    for _ in range(STEPS):
        t.step += 1
        rows.append(t.train_step())
        grads = grads or {n: p.grad.clone() for n, p in t.model.named_parameters()}
    return {"loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows]}, grads, logits


@pytest.mark.parametrize("name", list(CASES))
def test_vocab_split_tp_matches_one_process(ranks, tmp_path, name):
    out, (r0, r1) = ranks
    got = r0[name]
    assert r1[name]["loss"] == got["loss"]  # both TP ranks hold the one loss
    assert got["loss_head"] == "VocabParallelLoss"
    want, want_grads, want_logits = _one_process(name, tmp_path)
    logits = torch.load(out / f"logits_{name}.pt")  # `forward`: the vocab slices gathered whole
    assert type(logits) is torch.Tensor and rel_l2(logits, want_logits) <= KERNEL_FP32_REL
    assert max_rel(got["loss"][:1], want["loss"][:1]) <= FSDP_LOSS_REL
    assert max_rel(got["grad_norm"][:1], want["grad_norm"][:1]) <= FSDP_GRAD_NORM_REL
    assert max_rel(got["loss"], want["loss"]) <= KERNEL_FP32_REL
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= KERNEL_FP32_REL
    g, w = torch.load(out / f"grads_{name}.pt"), want_grads
    assert g.keys() == w.keys()
    worst = max((rel_l2(g[n], w[n]), n) for n in w)
    assert worst[0] <= KERNEL_FP32_REL, worst


@pytest.mark.parametrize("name", list(CASES))
def test_each_rank_stores_half_the_embedding_and_head(ranks, name):
    _, per_rank = ranks
    tied = CASES[name][0] == "glimmer"
    for r in per_rank:
        for part in ("embedding",) if tied else ("embedding", "head"):
            s = r[name][part]
            assert s["shape"] == [256, 64] and s["local_shape"] == [128, 64], (part, s)
            assert s["placements"][-1] == "S(0)", (part, s)  # the tp dimension splits the vocabulary rows
        if tied:
            assert r[name]["head"] is None  # the head is the embedding's one weight, split once


def test_a_vocabulary_tp_does_not_divide_is_refused(ranks):
    _, per_rank = ranks
    for r in per_rank:
        assert r["odd_vocab"] is not None and "tp (2)" in r["odd_vocab"] and "vocab_size (255)" in r["odd_vocab"]


def test_a_loss_head_without_a_vocab_parallel_form_is_refused():
    with pytest.raises(ConfigError, match="no vocab-parallel form"):
        VocabParallelLoss(nn.Identity())


@pytest.mark.parametrize("name", ["untied", "tied"])
def test_the_memory_estimate_stores_what_a_tp_rank_stores(ranks, tmp_path, name):
    """titan_core's estimate splits the embedding and head over TP as the ranks do. It splits every block
    parameter too, where the ranks keep the blocks' norms whole: the estimate is under by at most those."""
    _, per_rank = ranks
    cfg = case_cfg(name, tmp_path, tp=True)
    _, args, meta = build_model_from_config(cfg.model)
    setup = TrainSetup.from_config(cfg, resolve_degrees(cfg.parallelism, 2), device_type="cpu")
    estimated = estimate_memory(ModelShape.from_model(meta, args), setup).params // 4  # fp32 elements
    block_norms = sum(p.numel() for n, p in meta.layers.named_parameters() if "norm" in n)
    for r in per_rank:
        assert estimated <= r[name]["stored_elements"] <= estimated + block_norms, (estimated, r[name])
