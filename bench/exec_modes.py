"""Execution modes side by side: eager, per-block compile, Graph Trainer (none / inductor).

For each shape (the llama3 debugmodel, and a wider CPU shape: dim 512, 8 layers, sequence
512) and each mode, one fresh subprocess trains a few steps through the Trainer and
reports step time (median after warm-up), compile time (first step minus the median;
for the Graph Trainer also its trace / pass / backend-compile split), tokens/s, MFU and
peak memory (on CPU the process's peak RSS, compiler included). Then the make_fx trace
time of the whole step for 2, 8 and 32 layers, with and without scan over layers. Per
shape, one more process steps all modes round-robin, for step-time ratios that hold on
a machine whose load drifts.
Each subprocess gets an empty inductor cache, so compile times are cold. Prints JSON.

    python bench/exec_modes.py [--steps 6] [--shapes debugmodel,wide] [--modes ...]
                               [--trace-layers 2,8,32] [--interleaved-rounds 6]
                               [--out FILE] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = {
    "tiny": {
        "overrides": "{dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 256}",
        "batch": 2,
        "seq": 64,
    },
    "debugmodel": {"overrides": "{}", "batch": 8, "seq": 256},
    "wide": {
        "overrides": "{dim = 512, n_layers = 8, n_heads = 8, n_kv_heads = 4, ffn_hidden_dim = 1536}",
        "batch": 4,
        "seq": 512,
    },
}
MODES = {
    "eager": [],
    "per_block_inductor": ["--compile.enable", "--compile.backend=inductor"],
    "graph_none": ["--graph_trainer.enable"],
    "graph_inductor": ["--graph_trainer.enable", "--graph_trainer.compile=inductor"],
}


def _cfg(shape: str, mode: str, steps: int, device: str, dtype: str):
    from titan_core.config import load_config

    s = SHAPES[shape]
    return load_config(None, [
        "--model.family=llama3", f"--model.overrides={s['overrides']}", f"--training.batch_size={s['batch']}",
        f"--training.seq_len={s['seq']}", f"--training.steps={steps}", f"--device.type={device}",
        f"--training.dtype={dtype}", f"--training.mixed_precision_param={dtype}",
        "--parallelism.data_parallel=none", "--metrics.rich=false", f"--metrics.output_dir={tempfile.mkdtemp()}",
        *MODES[mode],
    ])  # fmt: skip


def _train_one(shape: str, mode: str, steps: int, device: str, dtype: str) -> dict:
    from titan_core.trainer import Trainer

    s = SHAPES[shape]
    t = Trainer(_cfg(shape, mode, steps, device, dtype), quiet=True)
    rows = t.train().metrics
    times = [r["step_time_s"] for r in rows]
    steady = statistics.median(times[2:]) if len(times) > 3 else times[-1]
    out = {
        "shape": shape,
        "mode": mode,
        "params": t.num_params,
        "tokens_per_step": s["batch"] * s["seq"],
        "step_time_s": steady,
        "first_step_s": times[0],
        "compile_time_s": max(times[0] - steady, 0.0),
        "tokens_per_s": s["batch"] * s["seq"] / steady,
        "mfu": statistics.median(r["mfu"] for r in rows[2:]) if len(rows) > 3 else rows[-1]["mfu"],
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rows),
        "losses": [r["loss"] for r in rows],
    }
    if t.graph_step is not None:
        st = t.graph_step.stats
        from titan_core.compile.graph_trainer import saved_activation_bytes

        saved = saved_activation_bytes(t.graph_step.captured.gm)
        out.update(trace_time_s=st.trace_time_s, passes_time_s=st.passes_time_s, backend_compile_s=st.compile_time_s,
                   programs_per_step=st.programs_per_step[-1], saved_activation_bytes=saved.device)  # fmt: skip
    return out


def _interleaved(shape: str, modes: list[str], rounds: int, device: str, dtype: str) -> dict:
    """Step time of every mode in one process, stepping them round-robin after their first step.

    On a machine shared with other work the load drifts; round-robin steps let the drift
    hit every mode alike, so the ratios between modes hold even when absolute times do not.
    """
    from titan_core.trainer import Trainer

    trainers = {}
    for mode in modes:
        t = Trainer(_cfg(shape, mode, rounds + 1, device, dtype), quiet=True)
        t.step = 1
        t.train_step()  # capture / compile
        trainers[mode] = t
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, t in trainers.items():
            t.step += 1
            times[mode].append(t.train_step()["step_time_s"])
    med = {m: statistics.median(v) for m, v in times.items()}
    return {
        "shape": shape,
        "rounds": rounds,
        "step_time_s": med,
        "speedup_vs_eager": {m: med.get("eager", float("nan")) / v for m, v in med.items()},
    }


def _trace_one(layers: int, scan: bool) -> dict:
    import torch

    from titan_core.compile.graph_trainer import GraphTrainerOptions, GraphTrainStep
    from titan_core.config.sections import Optimizer
    from titan_core.data.loader import Batch
    from titan_core.models import build_meta, resolve_args
    from titan_core.optim import build_optimizer

    args = resolve_args("llama3", "debugmodel", {"n_layers": layers})
    model = build_meta("llama3", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    opt = build_optimizer(model, Optimizer())
    batch = Batch(torch.randint(0, args.vocab_size, (2, 64)), torch.randint(0, args.vocab_size, (2, 64)))
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, options=GraphTrainerOptions(scan_layers=scan))
    t0 = time.perf_counter()
    step.capture([batch])
    return {"layers": layers, "scan": scan, "trace_time_s": step.stats.trace_time_s, "passes_time_s": step.stats.passes_time_s,
            "capture_total_s": time.perf_counter() - t0, "nodes": len(step.captured.gm.graph.nodes)}  # fmt: skip


def _subprocess(job: dict, timeout_s: float) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor_cold_"))
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", json.dumps(job)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,  # a failed mode is reported in the JSON, the others still run
        )
    except subprocess.TimeoutExpired:
        return {**job, "error": f"timed out after {timeout_s:g} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {**job, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]}
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--shapes", default="debugmodel,wide", help=f"of {', '.join(SHAPES)} (tiny: a smoke test)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--trace-layers", default="2,8,32")
    ap.add_argument("--interleaved-rounds", type=int, default=6, help="0 skips the round-robin step-time run")
    ap.add_argument("--skip-isolated", action="store_true", help="only the round-robin run (no per-mode processes)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        job = json.loads(a.one)
        kind = job.pop("kind")
        run = {"train": _train_one, "trace": _trace_one, "interleaved": _interleaved}[kind]
        print(json.dumps(run(**job)))
        return
    report: dict = {"train": [], "interleaved": [], "trace": [], "load_average_1m_start": os.getloadavg()[0]}
    for shape in [x for x in a.shapes.split(",") if x]:
        for mode in [x for x in a.modes.split(",") if x] if not a.skip_isolated else []:
            job = {
                "kind": "train",
                "shape": shape,
                "mode": mode,
                "steps": a.steps,
                "device": a.device,
                "dtype": a.dtype,
            }
            report["train"].append(_subprocess(job, a.timeout))
            print(json.dumps(report["train"][-1]), file=sys.stderr)
        if a.interleaved_rounds > 0:
            job = {"kind": "interleaved", "shape": shape, "modes": [x for x in a.modes.split(",") if x],
                   "rounds": a.interleaved_rounds, "device": a.device, "dtype": a.dtype}  # fmt: skip
            report["interleaved"].append(_subprocess(job, a.timeout))
            print(json.dumps(report["interleaved"][-1]), file=sys.stderr)
    for layers in [int(x) for x in a.trace_layers.split(",") if x]:
        for scan in (False, True):
            report["trace"].append(_subprocess({"kind": "trace", "layers": layers, "scan": scan}, a.timeout))
            print(json.dumps(report["trace"][-1]), file=sys.stderr)
    report["load_average_1m_end"] = os.getloadavg()[0]
    text = json.dumps(report, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
