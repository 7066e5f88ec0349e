"""One rank of the pipeline-parallel test: `python _pp_worker.py SCENARIO OUT CORPUS`.

Started by tests/core/dist/_world.py. SCENARIO pp2 (2 ranks): every case of _pp_cases.TWO_RANKS at
pp = 2; pp2dp2 (4 ranks): each run of _pp_cases.FOUR_RANKS (pp = 2 x dp_shard = 2, pp = 2 x dp_replicate
= 2). Each scenario in one process group.
After the last step each rank saves its stages' parameters (full tensors: a collective) to
OUT/<case>.rank<r>.pt, and writes every case's rows and stages to OUT/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _pp_cases import BATCH, FOUR_RANKS, TWO_RANKS, case_cfg  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

SCENARIOS = {
    "pp2": {name: (name, ("--parallelism.pp=2", "--parallelism.dp_shard=1")) for name in TWO_RANKS},
    "pp2dp2": {run: (case, ("--parallelism.pp=2", *dp)) for run, (case, dp) in FOUR_RANKS.items()},
}


CKPT = ("--checkpoint.enable", "--checkpoint.interval=2", "--checkpoint.folder=ckpt")


def checkpoints(out: Path, corpus: Path, rank: int, case: str = "1F1B") -> dict:
    """pp = 2 with DCP checkpoints: a run that saves at steps 2 and 4, and one that resumes from its step 2
    (case "tied": both stages save their copy of the tied weight under its one name)."""
    import shutil

    import torch.distributed as dist

    pp = ("--parallelism.pp=2", "--parallelism.dp_shard=1")
    tag = "" if case == "1F1B" else f"_{case}"
    full = Trainer(case_cfg(case, corpus, out / f"ckpt_full{tag}", *pp, *CKPT, batch_size=BATCH), quiet=True).train()
    if rank == 0:  # the resumed run finds step 2 only
        shutil.copytree(out / f"ckpt_full{tag}" / "ckpt" / "step-2", out / f"ckpt_resume{tag}" / "ckpt" / "step-2")
    dist.barrier()
    resumed = Trainer(case_cfg(case, corpus, out / f"ckpt_resume{tag}", *pp, *CKPT, "--checkpoint.resume=true",
                               batch_size=BATCH), quiet=True).train()  # fmt: skip
    return {"full": [r["loss"] for r in full.metrics], "resumed": [r["loss"] for r in resumed.metrics],
            "resumed_from": resumed.resumed_from,
            "saved": sorted(p.name for p in (out / f"ckpt_full{tag}" / "ckpt").iterdir())}


def main() -> None:
    scenario, out, corpus = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    res = {}
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        for name, (case, parallel) in SCENARIOS[scenario].items():
            t = Trainer(case_cfg(case, corpus, out / name, *parallel, batch_size=BATCH), quiet=True)
            rows = t.train().metrics
            params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                      for n, p in t.model.named_parameters()}  # fmt: skip
            torch.save(params, out / f"{name}.rank{state.rank}.pt")
            stored = t.model.layers[next(iter(t.model.layers))].attention.wq._parameters["weight"]
            res[name] = {
                "loss": [r["loss"] for r in rows],
                "grad_norm": [r["grad_norm"] for r in rows],
                "val_loss": [r.get("val_loss") for r in rows],
                "val_tokens": [r.get("val_tokens") for r in rows],
                "stages": t.pipeline.pipe.stage_indices,
                "layers": list(t.model.layers.keys()),
                "has_embedding": t.model.tok_embeddings is not None,
                "has_head": t.model.output is not None,
                "wq_local_rows": stored.to_local().shape[0],
                "wq_rows": stored.shape[0],
            }
        if scenario == "pp2":
            res["checkpoints"] = checkpoints(out, corpus, state.rank)
            res["checkpoints_tied"] = checkpoints(out, corpus, state.rank, "tied")
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
