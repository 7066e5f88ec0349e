"""One rank of the 2-process Graph Trainer test: `python _gt_dist_worker.py OUT_DIR`.

For a dense family and the MoE one (FAMILIES): 3 eager steps and 3 Graph Trainer steps under
SimpleFSDP, from the same init and data (and llama3's graph once more with scan over layers);
writes what it measured to OUT_DIR/rank_<r>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _tiny import local, tiny_cfg

from titan_core.runtime import distributed
from titan_core.training.trainer import Trainer


FAMILIES = ("llama3", "qwen3_moe")
"""Sharding puts the same collectives in every dense family's graph, so one dense family and the MoE
(its experts' weights gathered too); test_graph_trainer.py holds every family at one process."""


def _run(cfg):
    t = Trainer(cfg, quiet=True)
    rows = t.train().metrics
    return t, [r["loss"] for r in rows], [r["grad_norm"] for r in rows]


def main() -> None:
    out = Path(sys.argv[1])
    res = {}
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        eager_runs = {}
        for fam in FAMILIES:
            eager, e_loss, e_norm = eager_runs[fam] = _run(tiny_cfg(fam, out / f"e_{fam}", batch_size=2))
            graph, g_loss, g_norm = _run(tiny_cfg(fam, out / f"g_{fam}", "--graph_trainer.enable", batch_size=2))
            targets = [str(n.target) for n in graph.graph_step.captured.gm.graph.nodes]
            res[fam] = {
                "data_parallel": eager.cfg.parallelism.data_parallel,
                "mesh_mode": eager.degrees.mode,
                "eager_loss": e_loss,
                "graph_loss": g_loss,
                "eager_norm": e_norm,
                "graph_norm": g_norm,
                "params_equal": all(
                    torch.equal(local(p), local(q)) for p, q in zip(eager.model.parameters(), graph.model.parameters())
                ),
                "local_shard_shapes": [list(local(p).shape) for p in graph.model.parameters()][:2],
                "all_gathers": sum("all_gather_into_tensor" in t for t in targets),
                "reduce_scatters": sum("reduce_scatter_tensor" in t for t in targets),
                "programs_per_step": graph.graph_step.stats.programs_per_step,
            }
        # scan over layers: the SimpleFSDP gathers run inside the loop body, once per layer
        eager, e_loss, _ = eager_runs["llama3"]
        graph, g_loss, _ = _run(
            tiny_cfg("llama3", out / "g_scan", "--graph_trainer.enable", "--graph_trainer.scan_layers", batch_size=2)
        )
        res["scan"] = {
            "eager_loss": e_loss,
            "graph_loss": g_loss,
            "params_equal": all(
                torch.equal(local(p), local(q)) for p, q in zip(eager.model.parameters(), graph.model.parameters())
            ),
        }
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
