"""Execution modes side by side: eager, per-block compile, Graph Trainer (none / inductor).

Speed is reported through titan_core.measure.timing. Per shape (tiny: a smoke test; the llama3
debugmodel; a wider CPU shape: dim 512, 8 layers, sequence 512), one process builds a
Trainer per mode, runs each one's first step (capture / compile), then `compare`s every
mode against eager, interleaved (A B B A ...; each sample one `train_step()`), for
step-time ratios with their interval that hold on a machine whose load drifts.
Besides, each mode trains a few steps in a fresh subprocess for what only a run of its
own shows: compile time (first step minus the steady median; for the Graph Trainer also
its trace / pass / backend-compile split), step time, tokens/s and MFU over the steady
window (titan_core.measure.run_stats), peak memory (on CPU the process's peak RSS, compiler
included). Then the make_fx trace time of the whole step for 2, 8 and 32 layers, with and
without scan over layers. Each subprocess gets an empty inductor cache, so compile times
are cold. Prints JSON with the protocol's settings and the machine's load.

    python bench/exec_modes.py [--steps 6] [--shapes debugmodel,wide] [--modes ...]
                               [--trace-layers 2,8,32] [--skip-isolated] [--skip-interleaved]
                               [--min-rounds N --max-rounds N --max-seconds S]
                               [--out FILE] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _report  # noqa: E402

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
    from titan_core.measure.run_stats import RunStats
    from titan_core.training.trainer import Trainer

    s = SHAPES[shape]
    t = Trainer(_cfg(shape, mode, steps, device, dtype), quiet=True)
    rows = t.train().metrics
    stats = RunStats.from_rows(rows)
    out = {
        "shape": shape,
        "mode": mode,
        "params": t.num_params,
        "tokens_per_step": s["batch"] * s["seq"],
        **stats.measurements(),
        "first_step_s": rows[0]["step_time_s"],
        "compile_time_s": max(rows[0]["step_time_s"] - stats.step_time_median_s, 0.0),
        "losses": [r["loss"] for r in rows],
    }
    if t.graph_step is not None:
        st = t.graph_step.stats
        from titan_core.compile.graph_trainer import saved_activation_bytes

        saved = saved_activation_bytes(t.graph_step.captured.gm)
        out.update(trace_time_s=st.trace_time_s, passes_time_s=st.passes_time_s, backend_compile_s=st.compile_time_s,
                   programs_per_step=st.programs_per_step[-1], saved_activation_bytes=saved.device)  # fmt: skip
    return out


def _interleaved(shape: str, modes: list[str], device: str, dtype: str, protocol: dict) -> dict:
    """Every mode against eager in one process: `compare(mode_step, eager_step)`, one
    `train_step()` per sample, after each Trainer's first step (capture / compile)."""
    from titan_core.measure.timing import TimingProtocol, compare
    from titan_core.training.trainer import Trainer

    p = TimingProtocol.from_dict(protocol)
    modes = ["eager"] + [m for m in modes if m != "eager"]
    # enough for the lr schedule of the most-stepped (eager)
    steps = 1 + len(modes) * (p.warmup + p.max_rounds)
    trainers = {}
    for mode in modes:
        t = Trainer(_cfg(shape, mode, steps, device, dtype), quiet=True)
        t.step = 1
        t.train_step()  # capture / compile
        trainers[mode] = t

    def sample(mode: str):
        def one() -> float:
            t = trainers[mode]
            t.step += 1
            return t.train_step()["step_time_s"]

        return one

    comparisons = [
        _report.entry(compare(sample(mode), sample("eager"), p), mode, "eager", shape=shape) for mode in modes[1:]
    ]
    return {"shape": shape, "comparisons": comparisons}


def _trace_one(layers: int, scan: bool) -> dict:
    import torch

    from titan_core.compile.graph_trainer import GraphTrainStep
    from titan_core.config.sections import GraphTrainer, Optimizer
    from titan_core.data.base import Batch
    from titan_core.models import build_meta, resolve_args
    from titan_core.training.optim import build_optimizer

    args = resolve_args("llama3", "debugmodel", {"n_layers": layers})
    model = build_meta("llama3", args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    opt = build_optimizer(model, Optimizer())
    batch = Batch(torch.randint(0, args.vocab_size, (2, 64)), torch.randint(0, args.vocab_size, (2, 64)))
    step = GraphTrainStep(model, opt, max_norm=1.0, grad_accum=1, config=GraphTrainer(scan_layers=scan))
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
    ap.add_argument("--steps", type=int, default=6, help="steps of each mode's own run")
    ap.add_argument("--shapes", default="debugmodel,wide", help=f"of {', '.join(SHAPES)} (tiny: a smoke test)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--trace-layers", default="2,8,32")
    ap.add_argument("--skip-interleaved", action="store_true", help="no comparison run (only the per-mode processes)")
    ap.add_argument("--skip-isolated", action="store_true", help="only the comparison run (no per-mode processes)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    _report.add_protocol_args(ap)
    a = ap.parse_args()
    if a.one:
        job = json.loads(a.one)
        kind = job.pop("kind")
        run = {"train": _train_one, "trace": _trace_one, "interleaved": _interleaved}[kind]
        print(json.dumps(run(**job)))
        return
    protocol = _report.protocol_from(a)
    report = _report.start("exec_modes", protocol, device=a.device, dtype=a.dtype, train=[], trace=[])
    modes = [x for x in a.modes.split(",") if x]
    for shape in [x for x in a.shapes.split(",") if x]:
        for mode in modes if not a.skip_isolated else []:
            job = {"kind": "train", "shape": shape, "mode": mode, "steps": a.steps, "device": a.device,
                   "dtype": a.dtype}  # fmt: skip
            report["train"].append(_subprocess(job, a.timeout))
            _report.progress(report["train"][-1])
        if not a.skip_interleaved and any(m != "eager" for m in modes):
            job = {"kind": "interleaved", "shape": shape, "modes": modes, "device": a.device, "dtype": a.dtype,
                   "protocol": protocol.settings()}  # fmt: skip
            res = _subprocess(job, a.timeout)
            if "error" in res:
                report.setdefault("errors", []).append(res)
            report["comparisons"] += res.get("comparisons", [])
            _report.progress(res)
    for layers in [int(x) for x in a.trace_layers.split(",") if x]:
        for scan in (False, True):
            report["trace"].append(_subprocess({"kind": "trace", "layers": layers, "scan": scan}, a.timeout))
            _report.progress(report["trace"][-1])
    _report.emit(report, a.out)


if __name__ == "__main__":
    main()
