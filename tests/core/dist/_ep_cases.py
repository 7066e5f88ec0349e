"""What the expert-parallel tests share: the rank worker (_ep_worker.py, launched by _world.py), the
one-process reference (curve and step-1 gradients) and the comparison with it."""

from __future__ import annotations

from pathlib import Path

import torch
from _cases import GLOBAL_BATCH, max_rel, tiny_cfg
from _ep_worker import STEPS

from core_bounds import FSDP_LOSS_REL, KERNEL_FP32_REL
from titan_core.measure.numerics import rel_l2
from titan_core.training.trainer import Trainer

LOSS_TOL = FSDP_LOSS_REL
"""Loss and grad norm, every step: the simple_fsdp gate's fp32 bound (sharding changes the summation order only)."""
GRAD_TOL = KERNEL_FP32_REL
"""Each parameter's step-1 gradient, relative L2: fp32 rounding (measured about 1.5e-7)."""
WORKER = Path(__file__).with_name("_ep_worker.py")


def one_process(cfg) -> tuple[dict, dict]:
    """(curve, step-1 gradients) of a plain eager process."""
    trainer = Trainer(cfg, quiet=True)
    rows, grads = [], {}
    for _ in range(STEPS):
        trainer.step += 1
        rows.append(trainer.train_step())
        if trainer.step == 1:
            grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    return {"loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows]}, grads


def native_reference(out: Path, dp: int) -> tuple[dict, dict]:
    """The tiny qwen3_moe on the global batch's rows as `dp` micro-batches accumulated (its load-balancing
    loss is per forward pass, so each rank's rows are one pass: tests/core/dist/conftest.py)."""
    return one_process(tiny_cfg("qwen3_moe", out, "--parallelism.data_parallel=none", f"--training.grad_accum={dp}",
                                batch_size=GLOBAL_BATCH // dp, steps=STEPS))  # fmt: skip


def assert_same(got: dict, grads_file: Path, ref: tuple[dict, dict]) -> None:
    """A sharded run's curve and step-1 gradients (rank 0's file) equal the reference's within the bounds."""
    want, want_grads = ref
    assert max_rel(got["loss"], want["loss"]) <= LOSS_TOL, (got["loss"], want["loss"])
    assert max_rel(got["grad_norm"], want["grad_norm"]) <= LOSS_TOL, (got["grad_norm"], want["grad_norm"])
    grads = torch.load(grads_file)
    assert sorted(grads) == sorted(want_grads)
    errors = {n: rel_l2(grads[n], want_grads[n]) for n in grads}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRAD_TOL, (worst, errors[worst])
