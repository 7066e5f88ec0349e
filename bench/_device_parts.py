"""The device check's shapes, settings and parts (bench/device_check.py runs them; see its docstring).

A part trains one configuration through titan_core's own Trainer, built from a JobConfig the way a
recipe is (`load_config` with `--section.key=value` flags), and reports one JSON object: its speed
(whole steps, each bracketed by a device synchronisation), its step-1 loss, and its memory, the
trainer's own estimate (`Trainer.memory_estimate`, from titan_core/memory/preflight.py) beside what
was measured. A job is a list of parts run in one child process; each finished part is printed at
once as one `@part {...}` line, so a job killed for its time budget still hands over what it did.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter

# torch is imported where a part runs: the parent refuses a bad command line before loading it

PART_PREFIX = "@part "

SLICES = {
    # two decoder blocks at the published widths: the matmuls, attention and experts run at their
    # real shapes, and one GPU holds the slice with its fp32 master weights and AdamW state
    "llama3_8b": {"family": "llama3", "flavor": "8B", "overrides": {"n_layers": 2}, "seq": 4096},
    "qwen3_moe_30b_a3b": {"family": "qwen3_moe", "flavor": "30B-A3B", "overrides": {"n_layers": 2}, "seq": 4096},
}
TINY = {
    # head_dim is given because the flavors' own (128) would survive a smaller dim
    "llama3_8b": {"overrides": {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                                "ffn_hidden_dim": 128, "vocab_size": 256}, "seq": 32},
    "qwen3_moe_30b_a3b": {"overrides": {"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                                        "ffn_hidden_dim": 128, "vocab_size": 256, "n_experts": 8, "top_k": 2,
                                        "moe_hidden_dim": 32}, "seq": 32},
}  # fmt: skip
MODES = ("eager", "graph", "compile")
"""The three execution modes, in the order a job runs them: a slow or stuck compile last, where a
job's time budget cutting it short loses nothing else."""


def settings(device: str, tiny: bool, graph_compile: str) -> dict:
    """How every part trains on `device` (the JSON records it as it was used)."""
    cuda = device == "cuda"
    return {
        "device": device,
        "tiny": tiny,
        # fp32 master weights and AdamW state, bf16 compute through SimpleFSDP's gather (one rank);
        # CPU runs fp32, where the three modes agree to rounding and bf16 would be ~100x slower
        "param_dtype": "float32",
        "compute_dtype": "bfloat16" if cuda else "float32",
        "data_parallel": "simple_fsdp",
        # grouped_mm is bf16-only on CUDA and shape-static, so the captured step takes it; on CPU
        # fp32 the dense kernel is the static one (loop syncs the host, which the Graph Trainer refuses)
        "moe_kernel": "grouped_mm" if cuda else "dense",
        "compile_backend": "inductor" if cuda else "aot_eager",
        # one CPU thread: toy matmuls gain nothing from two, and on a busy 2-core machine a second
        # thread waits at every op for a core someone else holds (steps of 10 ms took 750)
        "cpu_threads": 0 if cuda else 1,
        "graph_compile": graph_compile,
        "warmup_steps": 2,
        "timed_steps": 2 if tiny else 6,
        "ce_chunk": 16 if tiny else 1024,  # tiny: several chunks even over 64 tokens
        "float8_recipe": "tensorwise",
        # step-1 losses of two runs of one batch: fp32 agrees to rounding; bf16 within a few of its
        # unit roundoffs (2^-8 = 3.9e-3)
        "loss_rel_tol": 1e-2 if cuda else 1e-5,
    }


def slice_spec(name: str, tiny: bool) -> dict:
    spec = dict(SLICES[name])
    if tiny:
        spec.update(TINY[name])
    return spec


def _toml_table(d: dict) -> str:
    return "{" + ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in d.items()) + "}"


def flags(spec: dict, s: dict, *, mode: str, batch: int, kernels: dict, out_dir: str) -> list[str]:
    """The `--section.key=value` overrides of one part (what `python -m titan_core.train` would take)."""
    f = [f"--model.family={spec['family']}", f"--model.flavor={spec['flavor']}",
         f"--model.overrides={_toml_table(spec['overrides'])}", f"--training.batch_size={batch}",
         f"--training.seq_len={spec['seq']}", f"--training.steps={s['warmup_steps'] + s['timed_steps']}",
         f"--training.dtype={s['param_dtype']}", f"--training.mixed_precision_param={s['compute_dtype']}",
         f"--parallelism.data_parallel={s['data_parallel']}", f"--device.type={s['device']}",
         f"--device.threads={s['cpu_threads']}", f"--kernels.ce_chunk={s['ce_chunk']}", "--metrics.rich=false",
         f"--metrics.output_dir={out_dir}"]  # fmt: skip
    if spec["family"] == "qwen3_moe":
        f.append(f"--kernels.moe={s['moe_kernel']}")
    f += [f"--kernels.{k}={v}" for k, v in kernels.items()]
    if mode == "graph":
        f += ["--graph_trainer.enable", f"--graph_trainer.compile={s['graph_compile']}"]
    elif mode == "compile":
        f += ["--compile.enable", f"--compile.backend={s['compile_backend']}"]
    return f


# ---- one part -------------------------------------------------------------------------------
def _release(device) -> None:
    """Drop what an earlier part left: compiled graphs hold their modules, the allocator its blocks."""
    import torch

    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _timed_step(trainer, device) -> tuple[dict, float]:
    """One whole optimizer step (data, forward, loss, backward, clipping, AdamW), wall clock between
    two synchronisations: the device's work is inside the interval, nothing queued before it is."""
    from titan_core.runtime.devices import synchronize

    synchronize(device)
    t0 = time.perf_counter()
    trainer.step += 1
    row = trainer.train_step()
    synchronize(device)
    return row, time.perf_counter() - t0


def _held_bytes(trainer) -> int:
    """Bytes of the tensors a trainer keeps between steps: parameters, buffers, AdamW state (one
    count per storage; a DTensor by its local shard)."""
    import torch
    from torch.distributed.tensor import DTensor

    tensors = [*trainer.model.parameters(), *trainer.model.buffers()]
    tensors += [v for st in trainer.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    storages = {}
    for t in tensors:
        t = t.to_local() if isinstance(t, DTensor) else t
        if not t.is_meta:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _memory(est, measured: int, how: str) -> dict:
    # the allocator and TensorPeak both see tensors only: compare with the estimate's training
    # moments less its runtime constant (0 on accelerators); the materialise moment is not measured
    moments = {"forward/backward turn": est.forward_backward, "optimizer step": est.optimizer_step}
    moment = max(moments, key=moments.get)
    tensors = moments[moment] - est.overhead
    return {
        "estimate_bytes": tensors,
        "estimate_moment": moment,
        "estimate_total_bytes": est.total,
        "estimate_total_moment": est.phase,
        "estimate_runtime_bytes": est.overhead,
        "estimate": est.describe(),
        "measured_peak_bytes": measured,
        "measured_by": how,
        "measured_over_estimate": round(measured / tensors, 4) if tensors > 0 else None,
    }


def _spread(times: list[float]) -> float:
    """Interquartile range over the median, as titan_core.measure.run_stats defines a run's spread."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(times)


def train_part(part: dict, s: dict, out_dir: str) -> dict:
    import torch

    from titan_core.config import load_config
    from titan_core.memory.tensor_peak import TensorPeak
    from titan_core.models.common.stats import flops_per_token
    from titan_core.training.trainer import Trainer

    device = torch.device(s["device"])
    spec, batch = part["spec"], part["batch"]
    _release(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    cfg = load_config(None, flags(spec, s, mode=part["mode"], batch=batch, kernels=part["kernels"], out_dir=out_dir))
    t0 = time.perf_counter()
    trainer = Trainer(cfg, quiet=True)
    try:
        build_s = time.perf_counter() - t0
        tokens = batch * spec["seq"]
        rows, times = [], []
        for i in range(s["warmup_steps"] + s["timed_steps"]):
            if device.type == "cpu" and i == 1:  # a warm-up step: TensorPeak's bookkeeping is not timed
                # step 1 made the AdamW state (and captured or compiled the step); gradients are
                # remade by the step, so they are dropped and counted by TensorPeak instead
                trainer.optimizer.zero_grad(set_to_none=True)
                held = _held_bytes(trainer)
                with TensorPeak() as tp:
                    row, dt = _timed_step(trainer, device)
                measured = held + tp.peak_bytes
            else:
                row, dt = _timed_step(trainer, device)
            if i == 0 and device.type == "cuda":
                # the steady steps' peak: capture and autotuning transients of step 1 are not training
                torch.cuda.reset_peak_memory_stats(device)
            rows.append(row)
            times.append(dt)
        if device.type == "cuda":
            measured, how = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated, steps 2.."
        else:
            how = "titan_core TensorPeak over step 2 + the parameters, buffers and AdamW state held before it"
        timed = times[s["warmup_steps"] :]
        tps = [tokens / t for t in timed]
        out = {
            "ran": True,
            "slice": part["slice"], "mode": part["mode"], "kernels": part["kernels"],
            "batch": batch, "seq": spec["seq"], "tokens_per_step": tokens, "params": trainer.num_params,
            "flops_per_token": flops_per_token(trainer.args, spec["seq"]),
            "trainer_peak_flops": trainer.peak_flops,
            "build_s": round(build_s, 3), "first_step_s": round(times[0], 3),
            "warmup_steps": s["warmup_steps"], "step_times_s": [round(t, 5) for t in timed],
            "step_time_median_s": statistics.median(timed), "step_time_spread": round(_spread(timed), 4),
            "tokens_per_s_median": statistics.median(tps), "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
            "losses": [r["loss"] for r in rows], "step1_loss": rows[0]["loss"], "step1_grad_norm": rows[0]["grad_norm"],
            "memory": _memory(trainer.memory_estimate, measured, how),
            "swaps": dict(Counter(trainer.swaps.values())),
            "allocated_before_build_bytes": before,
        }  # fmt: skip
        if trainer.graph_step is not None:
            st = trainer.graph_step.stats
            programs = st.programs_per_step[-1] if st.programs_per_step else None
            out["graph"] = {"trace_s": st.trace_time_s, "passes_s": st.passes_time_s,
                            "backend_compile_s": st.compile_time_s, "programs_per_step": programs}  # fmt: skip
        if trainer.compiled_modules:
            out["compiled_modules"] = len(trainer.compiled_modules)
        return out
    finally:
        trainer.close()
        del trainer
        _release(device)


def _optional_missing(part: dict) -> str | None:
    """Why an optional part cannot run here (float8 needs torchao), or None."""
    if "float8" not in part["kernels"]:
        return None
    try:
        import torchao  # noqa: F401
    except Exception as e:  # an install that is broken, not only absent, is not importable either
        return f"torchao not importable ({type(e).__name__}: {e})"
    return None


def emit(name: str, result: dict) -> None:
    print(PART_PREFIX + json.dumps({"name": name, **result}), flush=True)


def progress(text: str) -> None:
    print(f"[device_check] {text}", file=sys.stderr, flush=True)


def run_job(job: dict) -> None:
    """Every part of `job` in turn; a part that raises is reported and the next one runs."""
    from titan_core.kernels import KernelUnavailable

    s = job["settings"]
    # the trainers' output folder: the parent removes it, also after killing this process
    out_dir = tempfile.mkdtemp(prefix=f"{job['name']}_", dir=job["work_dir"])
    for part in job["parts"]:
        name, t0 = part["name"], time.perf_counter()
        progress(f"{name}: starting")
        why = _optional_missing(part)
        try:
            result = {"ok": True, "ran": False, "why": why} if why else {"ok": True, **train_part(part, s, out_dir)}
        except KernelUnavailable as e:
            # an optional kernel this device lacks (float8 below SM89) is a finding, not a failure
            optional = "float8" in part["kernels"]
            result = {"ok": optional, "ran": False, "why" if optional else "error": f"{type(e).__name__}: {e}"}
        except Exception as e:  # one part's failure must not cost the others their results
            tail = traceback.format_exc().strip().splitlines()[-6:]
            # (an out-of-memory part's tensors are freed with this traceback; the next part's
            # _release hands their blocks back to the device)
            result = {"ok": False, "ran": False, "error": f"{type(e).__name__}: {e}"[:2000], "traceback": tail}
        result["wall_s"] = round(time.perf_counter() - t0, 2)
        emit(name, result)
        line = result.get("error") or result.get("why") or f"{result['tokens_per_s_median']:,.0f} tokens/s"
        progress(f"{name}: {'ok' if result['ok'] else 'FAILED'} in {result['wall_s']} s: {line[:300]}")
