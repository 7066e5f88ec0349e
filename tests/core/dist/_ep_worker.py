"""One rank of the expert-parallel tests: `python _ep_worker.py SCENARIO OUT_DIR [HF_CONFIG]`.

Started by _world.launch (gloo). Scenarios: `w2` (2 ranks: the tiny qwen3_moe at
ep = 2, the same with a capacity that drops rows, a dense model refused, and the transformers
path's Qwen3-MoE at ep = 2 unless HF_CONFIG is "-"), `w4` (4 ranks: dp_shard = 4, ep = 2).
Each rank writes OUT/rank_<r>.json; rank 0 also writes each run's step-1 gradients (full
tensors) to OUT/grads_<run>.pt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from _cases import GLOBAL_BATCH, tiny_cfg  # noqa: E402
from _transformers_fsdp_worker import tf_cfg  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from titan_core.config.loader import ConfigError  # noqa: E402
from titan_core.runtime import distributed  # noqa: E402
from titan_core.training.trainer import Trainer  # noqa: E402

STEPS = 3


def ep_run(cfg, out: Path, name: str, rank: int) -> dict:
    """STEPS steps of `cfg`: the curve, the dropped rows per step, the step-1 gradients (rank 0 saves
    them) and where the first expert weight lives."""
    trainer = Trainer(cfg, quiet=True)
    rows, grads = [], {}
    for _ in range(STEPS):
        trainer.step += 1
        rows.append(trainer.train_step())
        if trainer.step == 1:  # every rank: full_tensor is a collective
            grads = {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                     for n, p in trainer.model.named_parameters()}  # fmt: skip
    if rank == 0:
        torch.save(grads, out / f"grads_{name}.pt")
    expert = next(p for n, p in trainer.model.named_parameters() if n.endswith(("experts.w1", "experts.gate_up_proj")))
    res = {
        "loss": [r["loss"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows],
        "dropped": [r.get("moe_dropped_tokens") for r in rows],
        "expert_mesh": list(expert.device_mesh.mesh_dim_names),
        "expert_placements": [str(p) for p in expert.placements],
        "expert_local_shape": list(expert.to_local().shape),
        "expert_shape": list(expert.shape),
    }
    trainer.close()
    return res


def losses(cfg) -> list[float]:
    return [r["loss"] for r in Trainer(cfg, quiet=True).train().metrics]


def refusal(cfg) -> str | None:
    try:
        Trainer(cfg, quiet=True)
    except ConfigError as e:
        return str(e)
    return None


def scenario_w2(out: Path, hf_config: str, rank: int) -> dict:
    half = GLOBAL_BATCH // 2
    res = {
        "native": ep_run(tiny_cfg("qwen3_moe", out / "native", "--parallelism.ep=2", batch_size=half, steps=STEPS),
                         out, "native", rank),
        # 64 tokens x top 2 over 4 experts per rank: capacity ceil(0.5 x 64 x 2 / 4) = 16 of 32 rows on average
        "capacity": ep_run(tiny_cfg("qwen3_moe", out / "cap", "--parallelism.ep=2",
                                    "--parallelism.ep_capacity_factor=0.5", batch_size=half, steps=STEPS),
                           out, "capacity", rank),
        # the other experts kernels under the dispatch (tokamax too, by hand: its JAX start-up costs seconds)
        "kernels": {moe: losses(tiny_cfg("qwen3_moe", out / moe, "--parallelism.ep=2", f"--kernels.moe={moe}",
                                         batch_size=half, steps=2)) for moe in ("grouped_mm", "dense")},
        "dense_refused": refusal(tiny_cfg("llama3", out / "dense", "--parallelism.ep=2", batch_size=half, steps=1)),
    }  # fmt: skip
    if hf_config != "-":  # "-": transformers is not installed
        res["transformers"] = ep_run(tf_cfg(out / "tf", hf_config, "--parallelism.ep=2", batch_size=half, steps=STEPS),
                                     out, "transformers", rank)  # fmt: skip
    return res


def scenario_w4(out: Path, rank: int) -> dict:
    cfg = tiny_cfg("qwen3_moe", out / "native4", "--parallelism.ep=2", batch_size=GLOBAL_BATCH // 4, steps=STEPS)
    return {"native": ep_run(cfg, out, "native4", rank)}


def main(scenario: str, out: Path, *args: str) -> None:
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        if scenario == "w2":
            res = scenario_w2(out, args[0], state.rank)
        else:
            res = scenario_w4(out, state.rank)
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])
