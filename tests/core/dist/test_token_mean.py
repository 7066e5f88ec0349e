"""The step loss is the mean over the valid tokens of the whole global batch (titan_core/parallel/token_mean.py).

Rows with very uneven numbers of ignored labels (`uneven_rows`: rank 0's rows 7 of 64 valid,
rank 1's 63 of 64) must give the loss and gradients of one process on the whole batch:
over 2 gloo ranks, over grad_accum micro-batches, and in the captured Graph Trainer step
(bit-identical to eager there). The tolerance is the simple_fsdp gate's
(tests/core/core_bounds.py states its checklist's numbers).
"""

from __future__ import annotations

import math

import pytest
import torch
from _cases import GLOBAL_BATCH, VALID_PER_ROW, tiny_cfg, uneven_batch
from torch.distributed.tensor import DTensor

from core_bounds import FSDP_GRAD_NORM_REL, FSDP_LOSS_REL
from titan_core.measure.numerics import rel, rel_l2
from titan_core.training.trainer import Trainer

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause

LOSS_TOL = FSDP_LOSS_REL
NORM_TOL = FSDP_GRAD_NORM_REL
GRAD_TOL = NORM_TOL
"""Per-parameter gradients are held to the grad-norm criterion's number (1e-6): stricter than the
gate, which judges the norm only. Measured: <= 2e-7 (fp32, summation order only)."""


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _train(cfg, batches_per_step: list[list], *, keep: bool = False):
    """Steps fed the given micro-batches: (metric rows, {name: full grad after the last step}, trainer)."""
    t = Trainer(cfg, quiet=True)
    t.data = iter([b for step in batches_per_step for b in step])
    rows = []
    try:
        for _ in batches_per_step:
            t.step += 1
            rows.append(t.train_step())
        # the Graph Trainer keeps its gradients inside the program: None there
        grads = {n: None if p.grad is None else _full(p.grad).clone() for n, p in t.model.named_parameters()}
    finally:
        if not keep:
            t.close()
    return rows, grads, t


def _one_process(family: str, out, *, accum: int = 1, steps: int = 1):
    """One plain process over the whole global batch of `uneven_batch(step)`, as `accum` micro-batches."""
    cfg = tiny_cfg(family, out, "--parallelism.data_parallel=none", f"--training.grad_accum={accum}",
                   batch_size=GLOBAL_BATCH // accum, steps=steps)  # fmt: skip
    return _train(cfg, [[uneven_batch(s, k, accum) for k in range(accum)] for s in range(steps)])


def _assert_same_step(got, want, what: str) -> None:
    (g_rows, g_grads, _), (w_rows, w_grads, _) = got, want
    e = rel(g_rows[0]["loss"], w_rows[0]["loss"])
    assert e <= LOSS_TOL, f"{what}: step-1 loss rel {e:.2e} > {LOSS_TOL:g} (the global token mean differs)"
    e = rel(g_rows[0]["grad_norm"], w_rows[0]["grad_norm"])
    assert e <= NORM_TOL, f"{what}: grad norm rel {e:.2e} > {NORM_TOL:g}"
    worst = max(w_grads, key=lambda n: rel_l2(g_grads[n], w_grads[n]))
    e = rel_l2(g_grads[worst], w_grads[worst])
    assert e <= GRAD_TOL, f"{what}: gradient of {worst} rel L2 {e:.2e} > {GRAD_TOL:g}"


def test_the_rows_are_uneven_enough_to_tell_the_two_normalisations_apart(tmp_path):
    """Guard of the data itself: on these rows the mean of the two halves' token means (the old
    normalisation) is far from the token mean over the whole batch."""
    assert sum(VALID_PER_ROW[:2]) * 8 < sum(VALID_PER_ROW[2:])
    t = Trainer(tiny_cfg("llama3", tmp_path, "--parallelism.data_parallel=none"), quiet=True)
    with torch.no_grad():
        halves = [t.model.loss(b.tokens, b.labels)[1].item() for b in (uneven_batch(0, k, 2) for k in range(2))]
        whole = t.model.loss(uneven_batch(0).tokens, uneven_batch(0).labels)[1].item()
    assert rel(sum(halves) / 2, whole) > 1e-3, (halves, whole)


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_grad_accum_over_uneven_micro_batches_equals_one_batch(tmp_path, family):
    """Micro-batch 0 holds the mostly ignored rows, micro-batch 1 the full ones."""
    acc = _one_process(family, tmp_path / "acc", accum=2)
    big = _one_process(family, tmp_path / "big")
    _assert_same_step(acc, big, f"{family} grad_accum = 2")


def test_a_micro_batch_without_valid_labels_adds_exactly_nothing(tmp_path):
    """Its CE is 0/0; it must contribute 0 (not NaN) to the loss and every gradient, so the step
    is exactly the step over the other micro-batch alone (its weight n * 1 / N is exactly 1.0)."""
    empty = uneven_batch(0, 0, 2)
    empty.labels.fill_(-100)
    full = uneven_batch(0, 1, 2)

    def mk(out, accum):
        return tiny_cfg(
            "llama3", out, "--parallelism.data_parallel=none", f"--training.grad_accum={accum}", batch_size=2, steps=1
        )

    rows, grads, _ = _train(mk(tmp_path / "with_empty", 2), [[empty, full]])
    want_rows, want_grads, _ = _train(mk(tmp_path / "alone", 1), [[full]])
    assert math.isfinite(rows[0]["loss"]) and math.isfinite(rows[0]["grad_norm"])
    assert rows[0]["loss"] == want_rows[0]["loss"] and rows[0]["grad_norm"] == want_rows[0]["grad_norm"]
    assert all(torch.equal(grads[n], want_grads[n]) for n in want_grads)


def test_a_step_without_any_valid_label_is_zero_not_nan(tmp_path):
    empty = uneven_batch(0)
    empty.labels.fill_(-100)
    rows, grads, _ = _train(tiny_cfg("llama3", tmp_path, "--parallelism.data_parallel=none", steps=1), [[empty]])
    assert rows[0]["loss"] == 0.0 and rows[0]["grad_norm"] == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_graph_trainer_equals_eager_on_uneven_labels(tmp_path, family):
    """Captured step == eager step bit for bit (loss, grad norm, params, AdamW state) with uneven
    micro-batches, then a step whose first micro-batch has no valid label (the 0/0 guard in the graph)."""
    empty = uneven_batch(1, 0, 2)
    empty.labels.fill_(-100)
    steps = [[uneven_batch(0, 0, 2), uneven_batch(0, 1, 2)], [empty, uneven_batch(1, 1, 2)]]
    moe = ["--kernels.moe=dense"] if family == "qwen3_moe" else []  # the capture-friendly experts

    def cfg(out, *extra):
        return tiny_cfg(family, out, "--training.grad_accum=2", *moe, *extra, batch_size=2, steps=2)

    e_rows, _, eager = _train(cfg(tmp_path / "e"), steps, keep=True)
    g_rows, _, graph = _train(cfg(tmp_path / "g", "--graph_trainer.enable"), steps, keep=True)
    try:
        assert [r["loss"] for r in g_rows] == [r["loss"] for r in e_rows]
        assert [r["grad_norm"] for r in g_rows] == [r["grad_norm"] for r in e_rows]
        assert all(math.isfinite(r["loss"]) for r in e_rows)
        for p, q in zip(eager.model.parameters(), graph.model.parameters()):
            assert torch.equal(_full(p.detach()), _full(q.detach()))
            se, sg = eager.optimizer.state[p], graph.optimizer.state[q]
            assert all(torch.equal(_full(se[k]), _full(sg[k])) for k in ("exp_avg", "exp_avg_sq", "step"))
        assert graph.graph_step.stats.programs_per_step == [1, 1] and graph.graph_step.stats.host_syncs == []
    finally:
        eager.close()
        graph.close()


# ---- two gloo ranks ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def w2(w2):
    """This scenario's part of the session's 2-rank launch (conftest.py)."""
    return {"ranks": [r["token_mean"] for r in w2["ranks"]], "grads": torch.load(w2["out"] / "token_mean_grads.pt")}


def test_two_ranks_log_the_same_global_loss(w2):
    r0, r1 = w2["ranks"]
    for fam in ("llama3", "qwen3_moe"):
        assert r0[fam]["loss"] == r1[fam]["loss"], fam
        assert r0[fam]["mode"] == "fully_shard"


def test_two_ranks_with_uneven_ignored_labels_equal_one_process_on_the_whole_batch(w2, tmp_path):
    rank0 = w2["ranks"][0]["llama3"]
    got = ([{"loss": rank0["loss"][0], "grad_norm": rank0["grad_norm"][0]}], w2["grads"]["llama3"], None)
    _assert_same_step(got, _one_process("llama3", tmp_path), "llama3, 2 ranks vs 1 process")


def test_two_ranks_moe_equal_one_process_with_a_micro_batch_per_rank(w2, tmp_path):
    """qwen3_moe's load-balancing term is a mean per forward pass, so 2 ranks equal one process with
    grad_accum = 2 (micro-batch k = rank k's rows), not one big batch; its CE is still the global token mean."""
    rank0 = w2["ranks"][0]["qwen3_moe"]
    got = ([{"loss": rank0["loss"][0], "grad_norm": rank0["grad_norm"][0]}], w2["grads"]["qwen3_moe"], None)
    _assert_same_step(got, _one_process("qwen3_moe", tmp_path, accum=2), "qwen3_moe, 2 ranks vs grad_accum = 2")


def test_two_ranks_graph_trainer_bit_identical_to_eager_on_uneven_labels(w2):
    for rank in w2["ranks"]:
        res = rank["graph_vs_eager"]
        assert res["graph"] == res["eager"]  # exact floats, both steps
        assert res["params_equal"] and res["optimizer_state_equal"]
        assert res["programs_per_step"] == [1, 1]
