"""SimpleFSDP vs FSDP2 vs one plain process: step time and collective bytes per step.

Same global batch in every mode: `none` runs it in one process (all cores), the sharded
modes split it over --nproc processes (cores / nproc threads each). Each run is a real
`titan_core` Trainer started through titan_core.launcher; step 2 is wrapped in a
CommCounter (titan_core/parallel/comm.py) for collective counts and payload bytes. Speed
is reported through titan_core.measure.timing: both sharded Trainers live in the same ranks and
`compare(fsdp2_step, simple_fsdp_step)` steps them interleaved (each sample one
`train_step()`, its time the slowest rank's, so every rank takes the same decisions).
The one-process run is a separate launch, timed apart: beside it each sharded mode gets the
ratio of their median step times as context (`timed_apart`: no interval and no faster / slower,
since load moves runs timed apart as much as a mode can). Step time, tokens/s and MFU of each run
are its steady window (titan_core.measure.run_stats). Prints JSON, with the protocol's settings and the load.

    python bench/data_parallel.py [--nproc 2] [--steps 8] [--shapes debugmodel,wide] [--none-threads 1]
                                  [--min-rounds N --max-rounds N]
    python bench/data_parallel.py --device cuda --nproc 1 --param-dtype bfloat16   # one GPU, bf16 policy
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _report  # noqa: E402
from titan_core.memory.estimate import format_bytes  # noqa: E402

SHAPES = {
    # a smoke test
    "tiny": {
        "overrides": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256},
        "batch": 4,
        "seq": 64,
    },
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


def _trainer(opts, mode: str, steps: int):
    from titan_core.config import load_config
    from titan_core.training.trainer import Trainer

    shape = SHAPES[opts.shape]
    dp = int(os.environ.get("WORLD_SIZE", "1")) if mode != "none" else 1
    cfg = load_config(None, [
        "--model.family=llama3", f"--model.overrides={_toml_table(shape['overrides'])}",
        f"--training.batch_size={shape['batch'] // dp}", f"--training.seq_len={shape['seq']}",
        f"--training.steps={steps}", f"--training.mixed_precision_param={opts.param_dtype}",
        f"--device.type={opts.device}", f"--device.threads={opts.threads}", f"--parallelism.data_parallel={mode}",
        "--metrics.rich=false", f"--metrics.output_dir={opts.out}/{opts.shape}_{mode}",
    ])  # fmt: skip
    return Trainer(cfg, quiet=True)


def worker(opts) -> None:
    """One rank: the modes of `--mode` (comma-separated) side by side; rank 0 writes the measurements."""
    import torch
    import torch.distributed as dist

    from titan_core.parallel.comm import CommCounter
    from titan_core.measure.run_stats import RunStats
    from titan_core.measure.timing import compare

    # every rank must time the same rounds (a round one rank took alone would desynchronise the
    # collectives): the protocol judges no load and retries nothing, and the clock below is agreed
    protocol = _report.protocol_from(opts)
    modes = opts.mode.split(",")
    steps = max(opts.steps, 2 + protocol.warmup + protocol.max_rounds) if len(modes) == 2 else opts.steps
    trainers = {m: _trainer(opts, m, steps) for m in modes}  # the first one made the process group: close it last
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    comm: dict[str, tuple[dict, dict]] = {}
    elapsed = [0.0]  # the comparison's clock: agreed step times, so every rank stops at the same round

    def step(mode: str) -> float:
        t = trainers[mode]
        t.step += 1
        if t.step == 2:
            with CommCounter() as c:
                row = t.train_step()
            comm[mode] = (c.counts(), c.bytes())
        else:
            row = t.train_step()
        rows[mode].append(row)
        dt = torch.tensor([row["step_time_s"]], dtype=torch.float64, device=t.device)
        if dist.is_initialized():
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        elapsed[0] += dt.item()
        return dt.item()

    for m in modes:
        step(m)  # the first step
        step(m)  # the counted one (CommCounter)
    cmp = None
    if len(modes) == 2:
        cmp = compare(lambda: step(modes[1]), lambda: step(modes[0]), protocol, clock=lambda: elapsed[0])
    else:
        while trainers[modes[0]].step < opts.steps:
            step(modes[0])
    if int(os.environ.get("RANK", "0")) == 0:
        shape = SHAPES[opts.shape]
        runs = []
        for m in modes:
            counts, nbytes = comm[m]
            runs.append(
                {
                    "shape": opts.shape,
                    "mode": m,
                    "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                    "threads_per_process": torch.get_num_threads(),
                    "params": trainers[m].num_params,
                    "tokens_per_step": shape["batch"] * shape["seq"],
                    **RunStats.from_rows(rows[m]).measurements(),
                    "collectives_per_step": counts,
                    "collective_bytes_per_step": nbytes,
                    "collective_size_per_step": format_bytes(sum(nbytes.values())),
                    "loss_first": rows[m][0]["loss"],
                    "loss_last": rows[m][-1]["loss"],
                }
            )
        comparisons = [_report.entry(cmp, modes[1], modes[0], shape=opts.shape)] if cmp else []
        Path(opts.result).write_text(json.dumps({"runs": runs, "comparisons": comparisons}))
    for t in reversed(trainers.values()):
        t.close(together=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="steps of the one-process run (and of a lone sharded mode)")
    ap.add_argument("--shapes", default="debugmodel,wide", help=f"of {', '.join(SHAPES)} (tiny: a smoke test)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--param-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--none-threads", type=int, default=0, help="threads of the one-process run (0: all cores)")
    _report.add_protocol_args(ap)
    # worker-side arguments (set by the parent)
    for hidden in ("--shape", "--mode", "--out", "--result"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        worker(opts)
        return

    import torch

    from onboard.ladder.gates import timed_apart
    from titan_core.launcher import cpu_count, launch_command

    protocol = _report.protocol_from(opts)
    modes = [m for m in opts.modes.split(",") if m]
    report = _report.start("data_parallel", protocol, device=opts.device, cpu_cores=cpu_count(),
                           torch=torch.__version__, param_dtype=opts.param_dtype, runs=[], timed_apart=[])  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_dp_") as tmp:
        for shape in opts.shapes.split(","):
            # the one-process run alone; the sharded modes together, compared interleaved
            groups = [g for g in (["none"] if "none" in modes else [], [m for m in modes if m != "none"]) if g]
            for group in groups:
                nproc = 1 if group == ["none"] else opts.nproc
                threads = max(1, cpu_count() // nproc) if opts.device == "cpu" else 0
                if group == ["none"] and opts.none_threads:
                    threads = opts.none_threads
                result = Path(tmp) / f"{shape}_{group[0]}.json"
                cmd = [
                    sys.executable,
                    __file__,
                    "--worker",
                    f"--shape={shape}",
                    f"--mode={','.join(group)}",
                    f"--steps={opts.steps}",
                    f"--device={opts.device}",
                    f"--param-dtype={opts.param_dtype}",
                    f"--threads={threads}",
                    f"--out={tmp}",
                    f"--result={result}",
                    *_report.protocol_args(protocol),
                ]
                launched = launch_command(cmd, nproc, timeout_s=opts.timeout)
                if launched.exit_code != 0:
                    report["runs"] += [{"shape": shape, "mode": m, "error": launched.failure} for m in group]
                    _report.progress(launched.failure)
                    continue
                res = json.loads(result.read_text())
                report["runs"] += res["runs"]
                report["comparisons"] += res["comparisons"]
                _report.progress(res)
            ok = {r["mode"]: r for r in report["runs"] if r["shape"] == shape and "error" not in r}
            for m in [m for m in ok if m != "none"] if "none" in ok else []:
                # two launches timed apart: their medians side by side as context, no interval, no outcome
                mine, alone = ok[m]["step_time_median_s"], ok["none"]["step_time_median_s"]
                line = timed_apart(mine, alone, "one process", m)
                report["timed_apart"].append({
                    "shape": shape, "candidate": m, "baseline": "none", "candidate_median_s": mine,
                    "baseline_median_s": alone, "baseline_over_candidate": alone / mine if mine else None,
                    "describe": line,
                })  # fmt: skip
                _report.progress(f"{shape}: {line}")
    _report.emit(report)


if __name__ == "__main__":
    main()
