"""SimpleFSDP vs FSDP2 vs one plain process: median step time and collective bytes per step.

Same global batch in every mode: `none` runs it in one process (all cores), the sharded
modes split it over --nproc processes (cores / nproc threads each). Each run is a real
`titan_core` Trainer started through titan_core.launcher; step 2 is wrapped in a
CommCounter (titan_core/parallel/comm.py) for collective counts and payload bytes.
Prints JSON, one entry per shape and mode.

    python bench/data_parallel.py [--nproc 2] [--steps 8] [--shapes debugmodel,wide] [--none-threads 1]
    python bench/data_parallel.py --device cuda --nproc 1 --param-dtype bfloat16   # one GPU, bf16 policy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = {
    # the llama3 debugmodel as its flavor defines it; global batch 8 x 256 tokens
    "debugmodel": {"overrides": {}, "batch": 8, "seq": 256},
    # few wide layers: 26M parameters, so communication is large next to compute
    "wide": {
        "overrides": {"dim": 1024, "n_layers": 2, "n_heads": 16, "n_kv_heads": 4, "ffn_hidden_dim": 2816},
        "batch": 4,
        "seq": 128,
    },
}
MODES = ("none", "simple_fsdp", "fsdp2")


def _toml_table(d: dict) -> str:
    return "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}"


def worker(opts) -> None:
    """One rank: train `--steps` steps and (rank 0) write the measurements."""
    import torch

    from titan_core.config import load_config
    from titan_core.parallel.comm import CommCounter
    from titan_core.trainer import Trainer

    shape = SHAPES[opts.shape]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = world if opts.mode != "none" else 1
    cfg = load_config(
        None,
        [
            "--model.family=llama3",
            f"--model.overrides={_toml_table(shape['overrides'])}",
            f"--training.batch_size={shape['batch'] // dp}",
            f"--training.seq_len={shape['seq']}",
            f"--training.steps={opts.steps}",
            f"--training.mixed_precision_param={opts.param_dtype}",
            f"--device.type={opts.device}",
            f"--device.threads={opts.threads}",
            f"--parallelism.data_parallel={opts.mode}",
            "--metrics.rich=false",
            f"--metrics.output_dir={opts.out}/{opts.shape}_{opts.mode}",
        ],
    )
    trainer = Trainer(cfg, quiet=True)
    times, counts, nbytes, losses = [], {}, {}, []
    for step in range(1, opts.steps + 1):
        trainer.step = step
        if step == 2:
            with CommCounter() as comm:
                row = trainer.train_step()
            counts, nbytes = comm.counts(), comm.bytes()
        else:
            row = trainer.train_step()
        times.append(row["step_time_s"])
        losses.append(row["loss"])
    if int(os.environ.get("RANK", "0")) == 0:
        steady = times[2:] if len(times) > 4 else times
        result = {
            "shape": opts.shape,
            "mode": opts.mode,
            "world_size": world,
            "threads_per_process": torch.get_num_threads(),
            "params": trainer.num_params,
            "tokens_per_step": shape["batch"] * shape["seq"],
            "step_time_median_s": statistics.median(steady),
            "tokens_per_s": shape["batch"] * shape["seq"] / statistics.median(steady),
            "collectives_per_step": counts,
            "collective_bytes_per_step": nbytes,
            "collective_mib_per_step": round(sum(nbytes.values()) / 2**20, 2),
            "loss_first": losses[0],
            "loss_last": losses[-1],
        }
        Path(opts.result).write_text(json.dumps(result))
    trainer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--shapes", default="debugmodel,wide")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--none-threads", type=int, default=0, help="threads of the one-process run (0: all cores)")
    # worker-side arguments (set by the parent)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        worker(opts)
        return

    from titan_core.launcher import cpu_count, launch_command

    runs = []
    load_before = os.getloadavg()[0]  # other work on the machine skews CPU timings: say how busy it was
    with tempfile.TemporaryDirectory(prefix="bench_dp_") as tmp:
        for shape in opts.shapes.split(","):
            for mode in opts.modes.split(","):
                nproc = 1 if mode == "none" else opts.nproc
                threads = max(1, cpu_count() // nproc) if opts.device == "cpu" else 0
                if mode == "none" and opts.none_threads:
                    threads = opts.none_threads
                result = Path(tmp) / f"{shape}_{mode}.json"
                cmd = [sys.executable, __file__, "--worker", f"--shape={shape}", f"--mode={mode}",
                       f"--steps={opts.steps}", f"--device={opts.device}", f"--param-dtype={opts.param_dtype}",
                       f"--threads={threads}", f"--out={tmp}", f"--result={result}"]  # fmt: skip
                launched = launch_command(cmd, nproc, timeout_s=opts.timeout)
                if launched.exit_code != 0:
                    runs.append({"shape": shape, "mode": mode, "error": launched.failure})
                    print(launched.failure, file=sys.stderr)
                    continue
                runs.append(json.loads(result.read_text()))
    import torch

    summary = {}
    for shape in opts.shapes.split(","):
        base = next((r for r in runs if r["shape"] == shape and r["mode"] == "none" and "error" not in r), None)
        for r in runs:
            if r["shape"] == shape and base and "error" not in r:
                summary[f"{shape}/{r['mode']}"] = round(r["step_time_median_s"] / base["step_time_median_s"], 3)
    out = {
        "benchmark": "data_parallel",
        "device": opts.device,
        "cpu_cores": cpu_count(),
        "torch": torch.__version__,
        "param_dtype": opts.param_dtype,
        "timed_steps": max(opts.steps - 2, 1),
        "load_avg_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "runs": runs,
        "step_time_vs_none": summary,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
