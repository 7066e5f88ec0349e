"""One rank of the context-parallel test: `python _cp_worker.py OUT ROOT SCENARIO`.

Started by tests/core/dist/_world.py. SCENARIO cp2 (2 ranks): every case of _cp_cases.CASES at
cp = 2 (both ranks read the whole global batch); dp2cp2 (4 ranks): the causal case at dp_shard = 2
x cp = 2 under SimpleFSDP and FSDP2, and at dp_replicate = 2 x cp = 2 (HSDP). Each trains STEPS
steps (`train_steps`); rank 0 saves the full gradients of step 1 to OUT/<run>.grads.pt; every rank
writes its rows to OUT/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _cp_cases import CASES, GLOBAL_BATCH, STEPS, case_cfg  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_core.parallel.context_parallel import ContextParallelAttention  # noqa: E402
from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

SCENARIOS = {
    "cp2": {name: (name, ("--parallelism.dp_shard=1", "--parallelism.cp=2"), GLOBAL_BATCH) for name in CASES},
    "dp2cp2": {
        "simple_fsdp": ("causal", ("--parallelism.dp_shard=2", "--parallelism.cp=2"), GLOBAL_BATCH // 2),
        "fsdp2": ("causal", ("--parallelism.dp_shard=2", "--parallelism.cp=2", "--parallelism.data_parallel=fsdp2"),
                  GLOBAL_BATCH // 2),
        "hsdp": ("causal", ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=1", "--parallelism.cp=2"),
                 GLOBAL_BATCH // 2),
    },
}


def full_grads(model) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
            for n, p in model.named_parameters()}  # fmt: skip


def train_steps(t: Trainer) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """STEPS steps, validating where due, as `Trainer.train` does; and the full gradients of step 1.

    Step 1's gradients, not the last step's: Adam turns rounding-level differences of near-zero
    gradients into whole-lr updates, so later steps' gradients drift apart by more than rounding."""
    rows, grads = [], {}
    for _ in range(STEPS):
        t.step += 1
        row = t.train_step()
        t.validator.maybe_run(t.model, t.step)
        rows.append(row | t.validator.columns(t.step))
        if t.step == 1:
            grads = full_grads(t.model)  # a collective: every rank
    return rows, grads


def run(name: str, case: str, parallel: tuple[str, ...], batch: int, out: Path, root: Path, rank: int) -> dict:
    t = Trainer(case_cfg(case, root / "corpus", out / name, *parallel, batch_size=batch), quiet=True)
    rows, grads = train_steps(t)
    if rank == 0:
        torch.save(grads, out / f"{name}.grads.pt")
    wq = t.model.layers["0"].attention.wq._parameters["weight"]
    return {
        "loss": [r["loss"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows],
        "val_loss": [r.get("val_loss") for r in rows],
        "val_tokens": [r.get("val_tokens") for r in rows],
        "cp_cores": sum(isinstance(m, ContextParallelAttention) for m in t.model.modules()),
        "loss_world": t.loss_world,
        "dp_world": t.dp_world,
        "wq_local_rows": wq.to_local().shape[0],
        "wq_rows": wq.shape[0],
    }


def main(out: Path, root: Path, scenario: str) -> None:
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        res = {name: run(name, *spec, out, root, state.rank) for name, spec in SCENARIOS[scenario].items()}
    assert STEPS == len(next(iter(res.values()))["loss"])
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
