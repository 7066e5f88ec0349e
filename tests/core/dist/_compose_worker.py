"""One rank of the composition matrix: `python _compose_worker.py WORLD OUT`.

Started by _world.launch. Trains every combination of _compose_cases.COMBOS whose world
size is WORLD, in one process group: first the parameters each rank holds against the one-process
init bit for bit, then STEPS steps; and writes its loss and grad norm per step (and what titan_core
built: its mesh, compiled blocks, pipeline stages, the experts' dispatch, a captured step) to OUT/rank_<r>.json.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _compose_cases import COMBOS, STEPS, combo_cfg, world_of  # noqa: E402
from _sharded_init_worker import one_process  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402


def _digest(embedding) -> str | None:
    """The sha256 of this rank's embedding weight, whole (a collective over its shards), None without one."""
    if embedding is None:
        return None
    w = embedding._parameters["weight"]
    full = w.full_tensor() if isinstance(w, DTensor) else w
    return hashlib.sha256(full.detach().contiguous().numpy().tobytes()).hexdigest()


def init_unequal(t: Trainer, cfg) -> list[str]:
    """The parameters this rank holds whose sharded init (gathered whole) is not the one-process init bit for bit."""
    want = one_process(cfg)
    got = {n: (p.full_tensor() if isinstance(p, DTensor) else p.detach()) for n, p in t.model.named_parameters()}
    return [n for n, g in got.items() if g.dtype != want[n].dtype or not torch.equal(g, want[n])]


def run(name: str, out: Path) -> dict:
    cfg = combo_cfg(name, out / name)
    t = Trainer(cfg, quiet=True)
    unequal = init_unequal(t, cfg)
    rows = []
    for _ in range(STEPS):
        t.step += 1
        rows.append(t.train_step())
    return {
        "init_unequal": unequal,
        "init_compared": sum(1 for _ in t.model.parameters()),
        "loss": [r["loss"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows],
        "compiled": len(t.compiled_modules),
        "mesh": dict(zip(t.mesh.mesh_dim_names, t.mesh.shape)),
        "stages": t.pipeline.pipe.stage_indices if t.pipeline is not None else None,
        "ep_dispatch": t.ep_dispatch is not None,
        "embedding": _digest(t.model.tok_embeddings),
        "captured": t.graph_step is not None,
    }


def main(world: int, out: Path) -> None:
    with distributed.process_group(torch.device("cpu"), timeout_s=180) as state:
        res = {name: run(name, out) for name in COMBOS if world_of(name) == world}
        (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
