"""What each rank holds while the Trainer builds a model from an HF checkpoint and takes one step, as a
fraction of the whole model's fp32 weights: sharded from the first byte.

The bench writes a llama-shaped fp32 checkpoint (default: hidden 1024, 20 layers, vocab 8192, MLP 2816,
about 0.97 GB, each block 5% of it: a depth like a real model's, where one block in flight is a small
part of a rank's memory; load_hf.py's writer, transformers' `save_pretrained` in 300 MB shards), then
for each layout (SimpleFSDP keeping its gathered weights and re-gathering them in the backward, FSDP2,
and tp 2 x dp re-gathering, on 4 and on 8 gloo ranks) starts the ranks. Each rank imports what the
build will use and joins the process group, and reads its peak resident set (VmHWM): what an empty rank
holds. Then it builds the Trainer from the recipe (`checkpoint.initial_hf` = the checkpoint: on meta,
parallelised there, its shards made real, the checkpoint read into them; titan_core/parallel/sharded_init.py)
and reads the peak again: (a) `build_ratio` = (peak - empty) / model bytes, bound 1/world + 0.05. Then one
AdamW step on one sequence of 64 tokens: (b) `step_ratio`, bound 0.7 at world 8 (fp32 master weights,
gradients and AdamW's two states are 4 x 1/world of the model; the rest is what a step gathers).

    nice python bench/sharded_build.py [--hidden 1024 --layers 20 --vocab 8192 --mlp 2816] [--worlds 4 8]
        [--layouts simple_fsdp fsdp2 ...] [--mmap-threshold BYTES] [--out FILE]

The resident set counts what the C allocator keeps, not only live tensors: glibc serves blocks under
its sliding mmap threshold (up to 32 MiB) from heaps it rarely returns, so a step's freed gradients and
temporaries stay resident. `--mmap-threshold 1048576` starts the ranks with MALLOC_MMAP_THRESHOLD_ set
(every block of 1 MiB or more mapped and unmapped on its own), so the peak follows what the trainer
holds; the report says which allocator setting each run had.

Prints one JSON document on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _report  # noqa: E402
from load_hf import add_checkpoint_args  # noqa: E402  the checkpoint writer's options, shared

LAYOUTS = {
    "simple_fsdp": ["--parallelism.data_parallel=simple_fsdp"],
    "simple_fsdp_reshard": ["--parallelism.data_parallel=simple_fsdp", "--parallelism.reshard_after_forward=true"],
    "fsdp2": ["--parallelism.data_parallel=fsdp2"],
    "tp2_reshard": ["--parallelism.data_parallel=simple_fsdp", "--parallelism.tp=2",
                    "--parallelism.reshard_after_forward=true"],
}
"""The layouts each world size runs (tp 2 takes dp_shard = world / 2). Every one gathers in bf16 over fp32
master weights (training.mixed_precision_param), as a recipe the plan writes does."""
STEP_BOUND = 0.7


def worker(a) -> None:
    """One rank: the empty peak, the build's, the step's; writes rank_<r>.json."""
    import safetensors.torch  # noqa: F401  what the load uses, imported by an empty rank too
    import torch

    from titan_core.config import load_config
    from titan_core.runtime import devices, distributed
    from titan_core.training.trainer import Trainer

    cpu = torch.device("cpu")

    torch.set_num_threads(1)
    ckpt = Path(a.ckpt)
    cfg = load_config(None, [
        "--model.family=llama3", f"--model.hf_config={ckpt / 'config.json'}", f"--checkpoint.initial_hf={ckpt}",
        "--device.type=cpu", "--training.batch_size=1", "--training.seq_len=64", "--training.steps=1",
        "--training.mixed_precision_param=bfloat16", "--metrics.log_freq=1", f"--metrics.output_dir={a.work}/run",
        *json.loads(a.flags),
    ])  # fmt: skip
    with distributed.process_group(torch.device("cpu"), timeout_s=900) as state:
        empty = devices.peak_memory_bytes(cpu)  # VmHWM: the peak resident set so far
        trainer = Trainer(cfg, quiet=True)
        built = devices.peak_memory_bytes(cpu)
        own = sum(p.to_local().numel() * p.element_size() for p in trainer.model.parameters())
        trainer.step += 1
        row = trainer.train_step()
        stepped = devices.peak_memory_bytes(cpu)
        out = {"rank": state.rank, "empty": empty, "built": built, "stepped": stepped, "own_bytes": own,
               "loss": row["loss"], "budget_bytes": trainer.sharded_init.budget_bytes}  # fmt: skip
    (Path(a.work) / f"rank_{state.rank}.json").write_text(json.dumps(out))


def run_layout(ckpt: Path, work: Path, world: int, name: str, flags: list[str], model_bytes: int,
               env: dict[str, str]) -> dict:  # fmt: skip
    from titan_core.launcher import launch_command

    work.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--worker", f"--ckpt={ckpt}", f"--work={work}", f"--flags={json.dumps(flags)}"]
    launched = launch_command(cmd, world, log_dir=work / "logs", timeout_s=1800, env={**os.environ, **env})
    if launched.exit_code != 0:
        return {"world": world, "layout": name, "error": launched.failure}
    ranks = [json.loads((work / f"rank_{r}.json").read_text()) for r in range(world)]
    build = max((r["built"] - r["empty"]) / model_bytes for r in ranks)
    step = max((r["stepped"] - r["empty"]) / model_bytes for r in ranks)
    res = {
        "world": world, "layout": name, "flags": flags,
        "build_ratio": round(build, 4), "build_bound": round(1 / world + 0.05, 4),
        "step_ratio": round(step, 4), "step_bound": STEP_BOUND if world == 8 else None,
        "own_shard_ratio": round(max(r["own_bytes"] for r in ranks) / model_bytes, 4),
        "loss": ranks[0]["loss"], "ranks": ranks,
    }  # fmt: skip
    res["ok"] = build <= 1 / world + 0.05 and (world != 8 or step <= STEP_BOUND)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_checkpoint_args(ap, hidden=1024, layers=20, vocab=8192, mlp=2816)
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--mmap-threshold", type=int, default=0,
                    help="MALLOC_MMAP_THRESHOLD_ for the ranks (0: glibc's own sliding threshold)")
    ap.add_argument("--out", default="", help="also write the JSON here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default="", help=argparse.SUPPRESS)
    ap.add_argument("--work", default="", help=argparse.SUPPRESS)
    ap.add_argument("--flags", default="[]", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    env = {"MALLOC_MMAP_THRESHOLD_": str(a.mmap_threshold)} if a.mmap_threshold else {}
    report = {"benchmark": "sharded_build", "load_avg_1m": {"start": _report.load()}, "runs": [], "comparisons": [],
              "allocator": env or "glibc's own sliding mmap threshold"}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="sharded_build_") as tmp:
        ckpt = Path(tmp) / "ckpt"
        _report.progress(f"writing the checkpoint into {ckpt}")
        shape = [f"--{k}={getattr(a, k)}" for k in ("hidden", "layers", "vocab", "mlp", "shard")]
        # load_hf.py's writer, in a process of its own (a rank's peak must not start from this one's)
        subprocess.run([sys.executable, str(Path(__file__).with_name("load_hf.py")), "--write", str(ckpt), *shape],
                       check=True)  # fmt: skip
        model_bytes = json.loads((ckpt / "bench_bytes.json").read_text())
        report["checkpoint"] = {"model_bytes": model_bytes,
                                "shape": {k: getattr(a, k) for k in ("hidden", "layers", "vocab", "mlp")}}  # fmt: skip
        for world in a.worlds:
            for name in a.layouts:
                flags = list(LAYOUTS[name])
                if name.startswith("tp2"):
                    flags.append(f"--parallelism.dp_shard={world // 2}")
                _report.progress(f"world {world}: {name}")
                res = run_layout(ckpt, Path(tmp) / f"{name}_{world}", world, name, flags, model_bytes, env)
                _report.progress({k: v for k, v in res.items() if k != "ranks"})
                report["runs"].append(res)
    report["load_avg_1m"]["end"] = _report.load()
    report["ok"] = all(r.get("ok") for r in report["runs"])
    _report.emit(report, a.out)


if __name__ == "__main__":
    main()
