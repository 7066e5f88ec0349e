"""One rank of a multi-process test scenario: `python _worker.py SCENARIO OUT_DIR [ARGS...]`.

Started by _world.launch (the environment gives RANK / WORLD_SIZE / MASTER_*). The
process group is created once here and every Trainer reuses it. Each rank writes what
it measured to OUT_DIR/rank_<r>.json; the pytest side compares with single-process runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch
from _cases import DENSE, FAMILIES, GLOBAL_BATCH, HSDP, RUN_STEPS, flux_cfg, tiny_cfg, uneven_batch
from torch.distributed.tensor import DTensor

from titan_core.runtime import distributed
from titan_core.parallel.comm import CommCounter
from titan_core.training.trainer import Trainer


def _steps(trainer: Trainer, n: int, comm_step: int | None = None) -> tuple[list[dict], dict]:
    rows, counts = [], {}
    for _ in range(n):
        trainer.step += 1
        if trainer.step == comm_step:
            with CommCounter() as comm:
                rows.append(trainer.train_step())
            counts = comm.counts()
        else:
            rows.append(trainer.train_step())
    return rows, counts


def _curve(rows: list[dict]) -> dict:
    return {"loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows]}


def _grad_layouts(trainer: Trainer) -> dict:
    out = {}
    for name, p in trainer.model.named_parameters():
        g = p.grad
        out[name] = {
            "param": [str(x) for x in p.placements] if isinstance(p, DTensor) else None,
            "grad": [str(x) for x in g.placements] if isinstance(g, DTensor) else None,
            "local_shapes_match": g is not None and tuple(g.to_local().shape) == tuple(p.to_local().shape),
            "grad_dtype": str(g.dtype) if g is not None else None,
        }
    return out


def _bf16_policy(family: str, out: Path, dp: int, reduce: str = "float32") -> dict:
    cfg = tiny_cfg(family, out / f"bf16_{family}_{reduce}", "--training.mixed_precision_param=bfloat16",
                   f"--training.mixed_precision_reduce={reduce}", batch_size=GLOBAL_BATCH // dp, steps=1)  # fmt: skip
    trainer = Trainer(cfg, quiet=True)
    wq = trainer.model.layers["0"].attention.wq
    read, stored = wq.weight, wq._parameters["weight"]
    exact_cast = torch.equal(read, stored.full_tensor().to(torch.bfloat16))
    trainer.step += 1
    with CommCounter() as comm:
        row = trainer.train_step()
    return {
        "read_dtype": str(read.dtype),
        "stored_dtype": str(stored.dtype),
        "stored_is_dtensor": isinstance(stored, DTensor),
        "read_is_cast_of_full_master": exact_cast,
        "grad_dtype": str(stored.grad.dtype),
        "loss": row["loss"],
        "comm_dtypes": comm.dtypes(),
    }


def scenario_w2(out: Path, b_ckpt: str) -> dict:
    """World size 2: SimpleFSDP (+ comm counts, grad layouts, bf16), FSDP2, TP = 2, replicate, DCP both ways,
    flux, then the token-mean scenario."""
    res: dict = {"simple_fsdp": {}, "fsdp2": {}, "tp": {}, "tp_sp": {}, "bf16": {}}
    for fam in FAMILIES:
        t = Trainer(tiny_cfg(fam, out / f"sfsdp_{fam}", batch_size=GLOBAL_BATCH // 2, steps=RUN_STEPS), quiet=True)
        rows, counts = _steps(t, RUN_STEPS, comm_step=2)
        res["simple_fsdp"][fam] = {**_curve(rows), "comm": counts, "grads": _grad_layouts(t), "mode": t.degrees.mode}
        t = Trainer(
            tiny_cfg(fam, out / f"fsdp2_{fam}", "--parallelism.data_parallel=fsdp2", batch_size=GLOBAL_BATCH // 2,
                     steps=RUN_STEPS),
            quiet=True,
        )
        res["fsdp2"][fam] = _curve(_steps(t, RUN_STEPS)[0])
        res["bf16"][fam] = _bf16_policy(fam, out, dp=2)
    res["bf16_reduce_bf16"] = _bf16_policy("llama3", out, dp=2, reduce="bfloat16")
    for fam in DENSE:
        t = Trainer(tiny_cfg(fam, out / f"tp_{fam}", "--parallelism.tp=2", "--parallelism.dp_shard=1", steps=RUN_STEPS),
                    quiet=True)
        res["tp"][fam] = _curve(_steps(t, RUN_STEPS)[0])
        t = Trainer(tiny_cfg(fam, out / f"tpsp_{fam}", "--parallelism.tp=2", "--parallelism.dp_shard=1",
                             "--parallelism.sequence_parallel", steps=RUN_STEPS), quiet=True)  # fmt: skip
        rows, counts = _steps(t, RUN_STEPS, comm_step=2)
        res["tp_sp"][fam] = {**_curve(rows), "comm": counts}
    t = Trainer(tiny_cfg("llama3", out / "replicate", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=1",
                         batch_size=GLOBAL_BATCH // 2, steps=RUN_STEPS), quiet=True)  # fmt: skip
    rows, counts = _steps(t, RUN_STEPS, comm_step=2)
    res["replicate"] = {**_curve(rows), "comm": counts, "grads": _grad_layouts(t), "mode": t.degrees.mode}
    # the flux diffusion transformer: sharded over both ranks, and HSDP's replicate dimension over both
    res["flux"] = {}
    for name, extra in (("simple_fsdp", ()), ("hsdp", ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=1"))):
        t = Trainer(flux_cfg(out / f"flux_{name}", *extra, batch_size=GLOBAL_BATCH // 2, steps=RUN_STEPS), quiet=True)
        res["flux"][name] = {**_curve(_steps(t, RUN_STEPS)[0]), "mode": t.degrees.mode}
    # DCP: a 2-rank run saving at steps 2 and 4 (the pytest side resumes it on 1 rank), and a
    # resume here of the checkpoint a 1-rank run saved at step 2
    ck = ("--checkpoint.enable", "--checkpoint.interval=2", "--checkpoint.folder=ckpt")
    t = Trainer(tiny_cfg("llama3", out / "dcp_a", *ck, batch_size=GLOBAL_BATCH // 2, steps=4), quiet=True)
    res["dcp_saved_at_2"] = _curve(t.train().metrics)
    t = Trainer(tiny_cfg("llama3", Path(b_ckpt), *ck, batch_size=GLOBAL_BATCH // 2, steps=4), quiet=True)
    result = t.train()
    res["dcp_resumed_at_2"] = {**_curve(result.metrics), "resumed_from": result.resumed_from}
    # test_token_mean.py's scenario, in this launch: a 2-rank launch costs seconds of start-up per rank
    res["token_mean"] = scenario_token_mean(out)
    return res


def scenario_w4(out: Path) -> dict:
    """World size 4: HSDP 2 x 2 for HSDP's families and flux, SimpleFSDP 2 x TP 2 for the dense ones, FSDP2 HSDP."""
    res: dict = {"hsdp": {}, "dp_tp": {}}
    for fam in HSDP:
        t = Trainer(
            tiny_cfg(fam, out / f"hsdp_{fam}", "--parallelism.dp_replicate=2", batch_size=GLOBAL_BATCH // 4,
                     steps=RUN_STEPS),
            quiet=True,
        )
        rows, counts = _steps(t, RUN_STEPS, comm_step=2)
        res["hsdp"][fam] = {**_curve(rows), "comm": counts, "mode": t.degrees.mode,
                            "mesh": list(t.mesh.mesh_dim_names), "grads": _grad_layouts(t)}  # fmt: skip
    t = Trainer(flux_cfg(out / "hsdp_flux", "--parallelism.dp_replicate=2", batch_size=GLOBAL_BATCH // 4,
                         steps=RUN_STEPS), quiet=True)  # fmt: skip
    res["flux_hsdp"] = {**_curve(_steps(t, RUN_STEPS)[0]), "mode": t.degrees.mode, "mesh": list(t.mesh.mesh_dim_names)}
    for fam in DENSE:
        t = Trainer(tiny_cfg(fam, out / f"dptp_{fam}", "--parallelism.tp=2", batch_size=GLOBAL_BATCH // 2,
                             steps=RUN_STEPS), quiet=True)  # fmt: skip
        res["dp_tp"][fam] = {**_curve(_steps(t, RUN_STEPS)[0]), "grads": _grad_layouts(t)}
    t = Trainer(tiny_cfg("qwen3", out / "dptp_sp", "--parallelism.tp=2", "--parallelism.sequence_parallel",
                         batch_size=GLOBAL_BATCH // 2, steps=RUN_STEPS), quiet=True)  # fmt: skip
    res["dp_tp_sp"] = {**_curve(_steps(t, RUN_STEPS)[0]), "grads": _grad_layouts(t)}
    t = Trainer(tiny_cfg("llama3", out / "fsdp2_hsdp", "--parallelism.data_parallel=fsdp2", "--parallelism.dp_replicate=2",
                         batch_size=GLOBAL_BATCH // 4, steps=RUN_STEPS), quiet=True)  # fmt: skip
    res["fsdp2_hsdp"] = {**_curve(_steps(t, RUN_STEPS)[0]), "grads": _grad_layouts(t)}
    return res


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t  # collective: every rank calls it


def _uneven_steps(trainer: Trainer, steps: int, rank: int, world: int) -> list[dict]:
    """`steps` steps, this rank fed its rows of `uneven_batch(step)` (very uneven ignored labels)."""
    trainer.data = iter([uneven_batch(s, rank, world) for s in range(steps)])
    return _steps(trainer, steps)[0]


def scenario_token_mean(out: Path) -> dict:
    """World size 2, rank 0's rows mostly ignored labels, rank 1's almost none: eager SimpleFSDP
    (llama3, and qwen3_moe for its aux term) one step, with every full gradient saved for the
    pytest side; then llama3 eager vs the Graph Trainer on two such steps."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    res: dict = {}
    grads = {}
    for fam in ("llama3", "qwen3_moe"):
        t = Trainer(tiny_cfg(fam, out / f"tm_{fam}", batch_size=GLOBAL_BATCH // world, steps=1), quiet=True)
        rows = _uneven_steps(t, 1, rank, world)
        res[fam] = {**_curve(rows), "mode": t.degrees.mode}
        grads[fam] = {n: _full(p.grad).clone() for n, p in t.model.named_parameters()}
        t.close()
    if rank == 0:
        torch.save(grads, out / "token_mean_grads.pt")
    runs = {}
    for name, extra in (("eager", ()), ("graph", ("--graph_trainer.enable",))):
        t = Trainer(
            tiny_cfg("llama3", out / f"tm_gt_{name}", *extra, batch_size=GLOBAL_BATCH // world, steps=2), quiet=True
        )
        runs[name] = (t, _uneven_steps(t, 2, rank, world))
    (e, e_rows), (g, g_rows) = runs["eager"], runs["graph"]
    params_equal = all(
        torch.equal(_full(p.detach()), _full(q.detach())) for p, q in zip(e.model.parameters(), g.model.parameters())
    )
    state_equal = all(
        torch.equal(_full(e.optimizer.state[p][k]), _full(g.optimizer.state[q][k]))
        for p, q in zip(e.model.parameters(), g.model.parameters())
        for k in ("exp_avg", "exp_avg_sq", "step")
    )
    res["graph_vs_eager"] = {"eager": _curve(e_rows), "graph": _curve(g_rows), "params_equal": params_equal,
                             "optimizer_state_equal": state_equal,
                             "programs_per_step": g.graph_step.stats.programs_per_step}  # fmt: skip
    return res


def main() -> None:
    scenario, out, *rest = sys.argv[1:]
    out = Path(out)
    # the ranks leave together: one still tearing down its gloo group after rank 0 (the store's
    # server) exited aborts with `terminate called without an active exception` (seen in CI here)
    with distributed.process_group(torch.device("cpu"), timeout_s=120) as state:
        res = {"w2": scenario_w2, "w4": scenario_w4}[scenario](out, *rest)
    (out / f"rank_{state.rank}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main()
