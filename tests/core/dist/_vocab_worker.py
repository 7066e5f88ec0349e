"""One rank of test_vocab_parallel.py: `python _vocab_worker.py OUT`.

Started by _world.launch (2 gloo ranks, both one TP group). For every case of
_vocab_cases.py: the logits of `probe_tokens` before training, 3 steps, each step's loss and grad norm, step 1's whole gradients (rank 0
saves them), the local shape and placement of the stored embedding and head, and how many
parameter elements the rank stores; then a
vocabulary tp does not divide, which must be refused. Writes OUT/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _cases import COMMON, tiny_cfg  # noqa: E402
from _vocab_cases import CASES, STEPS, TP, case_cfg, probe_tokens  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_core.config import ConfigError  # noqa: E402
from titan_core.parallel import stored_parameter  # noqa: E402
from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402


def _stored(module) -> dict:
    p = stored_parameter(module, "weight")
    return {"placements": [str(x) for x in p.placements], "local_shape": list(p.to_local().shape),
            "shape": list(p.shape)}  # fmt: skip


def _case(name: str, out: Path, rank: int) -> dict:
    t = Trainer(case_cfg(name, out, tp=True), quiet=True)
    with torch.no_grad():
        logits = t.model(probe_tokens())
    if rank == 0:
        torch.save(logits, out / f"logits_{name}.pt")
    rows = []
    for step in range(STEPS):
        t.step += 1
        rows.append(t.train_step())
        if step == 0:
            # full_tensor is a collective: every rank calls it
            grads = {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                     for n, p in t.model.named_parameters()}  # fmt: skip
            if rank == 0:
                torch.save(grads, out / f"grads_{name}.pt")
    model = t.model
    t.close()
    return {
        "loss": [r["loss"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows],
        "embedding": _stored(model.tok_embeddings),
        "head": None if model.output is None else _stored(model.output),
        "loss_head": type(model.loss_head).__name__,
        "stored_elements": sum(p.to_local().numel() for p in model.parameters()),
    }


def main(out: Path) -> None:
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        res = {name: _case(name, out, state.rank) for name in CASES}
        odd_vocab = "--model.overrides={" + COMMON.replace("vocab_size=256", "vocab_size=255") + "}"
        odd = tiny_cfg("llama3", out / "odd", odd_vocab, *TP, steps=1)
        try:
            Trainer(odd, quiet=True)
            res["odd_vocab"] = None
        except ConfigError as e:
            res["odd_vocab"] = str(e)
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
