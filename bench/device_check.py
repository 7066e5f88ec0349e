"""One command for the few minutes of a lent GPU: titan_core's execution modes and kernels at real widths.

What it measures, on one device, in bf16 mixed precision (fp32 master weights and AdamW state, bf16
compute through SimpleFSDP's gather at one rank):

- two slices, two decoder blocks each at the published widths: Llama 3 8B (dim 4096, 32 heads, 8 KV
  heads, MLP 14336, vocabulary 128256) and Qwen3-30B-A3B's MoE layers (dim 2048, 32 heads, 4 KV
  heads, 128 experts, top 8, expert width 768, vocabulary 151936; the grouped_mm experts on CUDA),
  sequence 4096, the batch the trainer's memory estimate fits in half the device's free memory (at
  most 4);
- each trained through titan_core's three execution modes: eager, per-block torch.compile (inductor),
  and the Graph Trainer (the whole step captured; `--graph-compile inductor` compiles it whole);
- per mode: tokens/s over whole steps after two warm-up steps, each step between two device
  synchronisations (median, min, max and the interquartile spread); MFU, titan_core's own
  `flops_per_token(args, seq)` over the bf16 peak of onboard/sizing/plan/hardware.py's table; the
  trainer's memory estimate against `torch.cuda.max_memory_allocated()` of the steady steps, and
  their ratio; the step-1 loss, which the three modes must agree on;
- fused linear cross-entropy (kernels.loss = fused_ce) against the plain loss on the 8B slice at the
  same batch: the peak memory of each, and their step-1 losses;
- float8 (kernels.float8 = tensorwise, through torchao when importable) against bf16 on the 8B slice,
  both under per-block compile: tokens/s.

Each group of parts runs in a child process with its share of the time budget (450 s for all of them
by default, so that the whole run ends within 8 minutes on one H200); a part that fails records its
error and the others go on, and a child killed at its budget still hands over the parts it finished.
The JSON (one object on stdout, and with `--out` written atomically after every group, so a run cut
short leaves what it measured) holds the versions, the device, every part's numbers and each part's
ok or error. Exit 0 when every part is ok, 1 when one failed, 2 for bad input. Installs nothing;
imports torch, titan_core, onboard's hardware table, and transformers and torchao when importable.

    PYTHONPATH=. python bench/device_check.py --out device_check.json        # a CUDA host
    PYTHONPATH=. python bench/device_check.py --device cpu --tiny            # the same path at toy sizes

`--tiny` runs the same code at toy sizes (dim 64, 2 layers, vocabulary 256, sequence 32, two timed
steps): on CPU in fp32 and one thread, with the dense experts kernel and the aot_eager compile
backend, the peak measured by titan_core's TensorPeak, float8 through torchao's emulation; in under a
minute (35-50 s measured on a shared, busy 2-core machine), so the check cannot rot between the
GPU's visits.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import _device_parts as parts_mod  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIN_TORCH, MIN_TRANSFORMERS = "2.11", "5.17"
BUDGET_S = {"full": 450.0, "tiny": 120.0}
"""Seconds the jobs may take together; the full run's 450 s leave the parent's own start and
sizing inside 8 minutes."""
SIZING_FRACTION = 0.5
"""Largest share of the device's free memory the estimate of the biggest part may take: the rest
covers what the estimate does not see (allocator fragmentation, kernel workspaces, compile)."""
BATCHES = (4, 2, 1)
MIN_JOB_S = 5.0
"""A job with less time than this left is not started: a process would not get past its imports."""


class BadInput(Exception):
    """A command line the check cannot run: one line, exit 2."""


# ---- the environment ----------------------------------------------------------------------------
def _version_at_least(version: str, minimum: str) -> bool:
    from torch.torch_version import TorchVersion

    return TorchVersion(version.split("+")[0]) >= minimum


def versions() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import transformers

        v = transformers.__version__
        at_least = _version_at_least(v, MIN_TRANSFORMERS)
        out["transformers"] = {"importable": True, "version": v, f"at_least_{MIN_TRANSFORMERS}": at_least}
    except Exception as e:  # a broken install is as unusable as a missing one
        out["transformers"] = {"importable": False, "why": f"{type(e).__name__}: {e}"[:500]}
    # importing torchao takes seconds: the float8 part imports it (and says so when it cannot)
    try:
        out["torchao"] = {"installed": importlib.metadata.version("torchao"), "imported_by": "the float8 part"}
    except importlib.metadata.PackageNotFoundError:
        out["torchao"] = {"installed": None, "imported_by": "the float8 part"}
    return out


def device_info(device: str) -> dict:
    import torch

    from titan_core.runtime.devices import device_name

    info = {"type": device, "name": device_name(torch.device(device))}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(capability=f"{props.major}.{props.minor}", total_memory_bytes=props.total_memory,
                    count=torch.cuda.device_count())  # fmt: skip
    else:
        info["threads"] = torch.get_num_threads()
    return info


def peak(device: dict) -> dict:
    """The bf16 peak MFU divides by: onboard's hardware table for a GPU; None on CPU, where each part
    uses the trainer's own (the best matmul rate measured on this machine)."""
    if device["type"] != "cuda":
        return {"flops": None, "source": "CPU: each part's trainer peak, the best matmul rate measured on this "
                "machine (titan_core/runtime/cpu_peak.py); CPU MFU is indicative"}  # fmt: skip
    from onboard.sizing.plan.hardware import HARDWARE

    for kind, hw in HARDWARE.items():
        if hw.device_type == "cuda" and kind in device["name"].lower():
            return {"flops": hw.peak_bf16, "source": f"onboard/sizing/plan/hardware.py HARDWARE[{kind!r}]: {hw.source}"}
    return {"flops": None, "source": f"no row of onboard/sizing/plan/hardware.py names {device['name']!r}: each part "
            "uses the trainer's (titan_core.runtime.devices.PEAK_BF16_FLOPS; nan when unknown)"}  # fmt: skip


def size_batch(spec: dict, s: dict) -> dict:
    """The largest of BATCHES whose estimate (eager, plain loss: the biggest part) fits SIZING_FRACTION of
    the device's budget, by the trainer's own estimate and budget functions on the meta model."""
    from titan_core.config import load_config
    from titan_core.models.common.swaps import apply_swaps
    from titan_core.kernels import swaps_for
    from titan_core.memory.budget import device_budget
    from titan_core.memory.preflight import estimate_for
    from titan_core.parallel import check_parallelism
    from titan_core.models.model_builder import build_model_from_config

    budget = device_budget(s["device"])
    for batch in BATCHES if not s["tiny"] else (2,):
        cfg = load_config(None, parts_mod.flags(spec, s, mode="eager", batch=batch, kernels={},
                                                out_dir=tempfile.gettempdir()))  # fmt: skip
        _, args, model = build_model_from_config(cfg.model)
        apply_swaps(model, swaps_for(cfg.kernels))
        _, _, est = estimate_for(cfg, model, args, s["device"], check_parallelism(cfg, 1))
        if budget is None or est.total <= SIZING_FRACTION * budget.bytes or batch == 1:
            return {"batch": batch, "estimate_bytes": est.total, "budget_bytes": budget and budget.bytes,
                    "budget_source": budget and budget.source, "fraction": SIZING_FRACTION}  # fmt: skip
    raise AssertionError("unreachable: batch 1 always returns")


# ---- the jobs -----------------------------------------------------------------------------------
def plan(s: dict) -> tuple[list[dict], dict]:
    """(jobs, sizing): one job per slice (its three modes), one for the kernels on the 8B slice."""
    specs = {name: parts_mod.slice_spec(name, s["tiny"]) for name in parts_mod.SLICES}
    sizing = {name: size_batch(spec, s) for name, spec in specs.items()}

    def part(name: str, slice_name: str, mode: str, kernels: dict) -> dict:
        return {"name": name, "slice": slice_name, "mode": mode, "kernels": kernels, "spec": specs[slice_name],
                "batch": sizing[slice_name]["batch"]}  # fmt: skip

    jobs = [{"name": sl, "parts": [part(f"{sl}/{m}", sl, m, {}) for m in parts_mod.MODES]} for sl in specs]
    jobs.append({"name": "kernels", "parts": [
        part("fused_ce", "llama3_8b", "eager", {"loss": "fused_ce"}),  # against llama3_8b/eager
        part("float8", "llama3_8b", "compile", {"float8": s["float8_recipe"]}),  # against llama3_8b/compile
    ]})  # fmt: skip
    return [{**j, "settings": s} for j in jobs], sizing


class Child:
    """One job's process, in a session of its own so that a timeout ends its compile workers too."""

    def __init__(self, job: dict):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, __file__, "--job", json.dumps(job)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)  # fmt: skip
        self.results: dict[str, dict] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=8)
        self.readers = [threading.Thread(target=f, daemon=True) for f in (self._stdout, self._stderr)]
        for r in self.readers:
            r.start()

    def _stdout(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(parts_mod.PART_PREFIX):
                try:
                    result = json.loads(line[len(parts_mod.PART_PREFIX) :])
                except json.JSONDecodeError:  # a line cut off by the kill: that part is missing
                    continue
                self.results[result.pop("name")] = result

    def _stderr(self) -> None:
        for line in self.proc.stderr:  # the child's progress, passed on as it comes
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.strip():
                self.tail.append(line.rstrip())

    def finish(self, timeout_s: float) -> str | None:
        """Wait up to `timeout_s`; kill the process group after it. Why parts may be missing, or None."""
        why = None
        try:
            self.proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            why = f"its job ran out of its time budget ({timeout_s:.0f} s) and was stopped"
        finally:
            self.stop()
        if why is None and self.proc.returncode != 0:
            last = next((ln for ln in reversed(self.tail) if not ln.startswith("[device_check]")), "")
            why = f"its job's process exited with {self.proc.returncode}: {last[:500] or 'no message'}"
        return why

    def stop(self) -> None:
        """End the job's session (the child, and compile workers it left: they hold its pipes open),
        then take in what it printed."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the child and everything it started have ended
            pass
        self.proc.wait()
        for r in self.readers:
            r.join(timeout=10)


# ---- the report ---------------------------------------------------------------------------------
def _rel(a, b) -> float | None:
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)) or b == 0:
        return None
    return abs(a - b) / abs(b)


def add_mfu(parts: dict, peak_info: dict) -> None:
    for p in parts.values():
        if not p.get("ran"):
            continue
        flops = peak_info["flops"] or p["trainer_peak_flops"]
        ok = isinstance(flops, (int, float)) and math.isfinite(flops) and flops > 0
        p["peak_flops"] = flops if ok else None
        p["mfu"] = p["flops_per_token"] * p["tokens_per_s_median"] / flops if ok else None


def _slice(parts: dict, sl: str, tol: float) -> dict:
    """One slice's three modes side by side; their step-1 losses against eager's."""
    eager_loss = parts.get(f"{sl}/eager", {}).get("step1_loss")
    modes = {}
    for m in parts_mod.MODES:
        p = parts.get(f"{sl}/{m}", {})
        modes[m] = {
            "ok": p.get("ok", False),
            "tokens_per_s": p.get("tokens_per_s_median"),
            "mfu": p.get("mfu"),
            "step1_loss": p.get("step1_loss"),
            "step1_loss_rel_diff_vs_eager": _rel(p.get("step1_loss"), eager_loss),
            "memory_measured_over_estimate": p.get("memory", {}).get("measured_over_estimate"),
        }
    diffs = [v["step1_loss_rel_diff_vs_eager"] for v in modes.values()]
    return {"modes": modes, "loss_rel_tol": tol, "step1_losses_agree": None if None in diffs else max(diffs) <= tol}


def _not_run(**named: dict) -> str:
    """Why each of the named parts has no numbers."""
    why = [f"{n}: {p.get('error') or p.get('why') or 'missing'}" for n, p in named.items() if not p.get("ran")]
    return "; ".join(why)


def _fused_ce(plain: dict, fused: dict, s: dict) -> dict:
    """fused_ce against the plain loss (llama3_8b/eager): same slice, batch and mode."""
    if not (plain.get("ran") and fused.get("ran")):
        return {"ran": False, "ok": False, "why": "not both measured: " + _not_run(**{"llama3_8b/eager": plain,
                                                                                    "fused_ce": fused})}  # fmt: skip
    pm, fm = plain["memory"]["measured_peak_bytes"], fused["memory"]["measured_peak_bytes"]
    diff = _rel(fused["step1_loss"], plain["step1_loss"])
    return {
        "ran": True, "ok": True, "batch": fused["batch"], "seq": fused["seq"], "ce_chunk": s["ce_chunk"],
        "plain_peak_bytes": pm, "fused_peak_bytes": fm, "fused_over_plain_peak": round(fm / pm, 4),
        "saved_bytes": pm - fm, "plain_step1_loss": plain["step1_loss"], "fused_step1_loss": fused["step1_loss"],
        "loss_rel_diff": diff, "loss_rel_tol": s["loss_rel_tol"],
        "losses_agree": diff is not None and diff <= s["loss_rel_tol"],
        "plain_tokens_per_s": plain["tokens_per_s_median"], "fused_tokens_per_s": fused["tokens_per_s_median"],
    }  # fmt: skip


def _float8(base: dict, f8: dict, s: dict) -> dict:
    """float8 against the same slice and mode without it (llama3_8b/compile)."""
    if not f8.get("ran"):
        # torchao missing or a GPU below SM89 is ok (ran: false, why); an error is not
        return {"ran": False, "ok": f8.get("ok", False), "why": _not_run(float8=f8) or "missing"}
    speed = base.get("tokens_per_s_median")
    out = {
        "ran": True, "ok": True, "recipe": s["float8_recipe"], "mode": "compile",
        "baseline": f"llama3_8b/compile ({s['compute_dtype']})",
        "float8_tokens_per_s": f8["tokens_per_s_median"], "baseline_tokens_per_s": speed,
        "float8_over_baseline": f8["tokens_per_s_median"] / speed if speed else None,
        "step1_loss": f8["step1_loss"], "baseline_step1_loss": base.get("step1_loss"),
        "emulated": s["device"] == "cpu",
    }  # fmt: skip
    if s["device"] == "cpu":
        out["note"] = "torchao's CPU emulation: the numerics of float8, not its speed"
    return out


def summarise(parts: dict, s: dict) -> dict:
    """Each slice's modes side by side, the fused CE and float8 comparisons (from the parts' numbers)."""
    return {
        "slices": {sl: _slice(parts, sl, s["loss_rel_tol"]) for sl in parts_mod.SLICES},
        "fused_ce": _fused_ce(parts.get("llama3_8b/eager", {}), parts.get("fused_ce", {}), s),
        "float8": _float8(parts.get("llama3_8b/compile", {}), parts.get("float8", {}), s),
    }


def write(report: dict, out: Path | None) -> str:
    text = json.dumps(report, indent=2, allow_nan=False, default=str)
    if out is not None:
        from titan_core.runtime.files import atomic_write_text

        atomic_write_text(out, text + "\n")  # a temp file in the same folder, then os.replace
    return text


def _finite(obj):
    """JSON has no nan or inf: they become null (a peak nobody knows is None, not a number)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# ---- the command line ---------------------------------------------------------------------------
def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the JSON here (atomically, after every job)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="toy sizes: the same path in well under a minute")
    ap.add_argument("--graph-compile", choices=["none", "inductor"], default="none",
                    help="graph_trainer.compile: none runs the captured step as traced; inductor compiles "
                    "it whole")  # fmt: skip
    ap.add_argument("--budget-s", type=_budget, help=f"seconds for all jobs (default {BUDGET_S['full']:g}; tiny "
                    f"{BUDGET_S['tiny']:g})")  # fmt: skip
    ap.add_argument("--job", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def check_input(a: argparse.Namespace) -> None:
    """The command line's own mistakes first (no torch loaded for them), then what this machine lacks."""
    if a.device == "cpu" and not a.tiny:
        raise BadInput("--device cpu runs only with --tiny: the full-width slices need a GPU")
    if a.out is not None:
        folder = a.out.resolve().parent
        if a.out.is_dir():
            raise BadInput(f"--out {a.out}: is a folder, not a file")
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise BadInput(f"--out {a.out}: the folder {folder} does not exist or is not writable")
    import torch

    if not _version_at_least(torch.__version__, MIN_TORCH):
        raise BadInput(f"needs torch >= {MIN_TORCH}, this is {torch.__version__}")
    if a.device == "cuda" and not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise BadInput(f"--device cuda: CUDA is not available on this machine (torch {torch.__version__}, {build}); "
                       "on a CPU run --device cpu --tiny")  # fmt: skip


def run(a: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    s = parts_mod.settings(a.device, a.tiny, a.graph_compile)
    budget = a.budget_s or BUDGET_S["tiny" if a.tiny else "full"]
    report = {"benchmark": "device_check", "complete": False, "ok": False, "argv": sys.argv[1:],
              "versions": versions(), "device": device_info(a.device),
              "settings": {**s, "budget_s": budget}}  # fmt: skip
    report["peak"] = peak(report["device"])
    # the summaries first, the parts' own numbers after them (flush fills these in)
    report.update(sizing={}, slices={}, fused_ce={}, float8={}, parts={})
    parts: dict[str, dict] = {}
    child = None

    def flush(complete: bool) -> str:
        add_mfu(parts, report["peak"])
        report.update(parts=parts, **summarise(parts, s), complete=complete, wall_s=round(time.perf_counter() - t0, 1))
        report["ok"] = complete and bool(parts) and all(p.get("ok") for p in parts.values())
        return write(_finite(report), a.out)

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    work = tempfile.mkdtemp(prefix="device_check_")  # the trainers' output folders, removed at the end
    try:
        jobs, report["sizing"] = plan(s)
        parts_mod.progress(f"batches {({k: v['batch'] for k, v in report['sizing'].items()})}; budget {budget:g} s")
        deadline = time.perf_counter() + budget
        for i, job in enumerate(jobs):
            # an even share of what is left: a job that ends early leaves its time to the later ones
            share = (deadline - time.perf_counter()) / (len(jobs) - i)
            if share < MIN_JOB_S:
                why = f"the time budget was spent before its job started ({share:.0f} s left of it)"
            else:
                child = Child({**job, "work_dir": work})
                why = child.finish(share)
                parts.update(child.results)
            for p in job["parts"]:
                parts.setdefault(p["name"], {"ok": False, "ran": False, "error": f"not reported: {why or 'no result'}"})
            flush(complete=False)
        text = flush(complete=True)
    except Exception as e:  # the sizing (titan_core refusing a slice's config) or this script's own bug
        report["error"] = f"{type(e).__name__}: {e}"
        text = flush(complete=False)
    except KeyboardInterrupt as e:
        if child is not None:
            child.stop()
            parts.update(child.results)
        report["interrupted"] = str(e) or "KeyboardInterrupt"
        text = flush(complete=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(text, flush=True)
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.job:
        parts_mod.run_job(json.loads(a.job))
        return 0
    try:
        check_input(a)
    except BadInput as e:
        print(f"device_check: {e}", file=sys.stderr)
        return 2
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
