"""Rung 1, `eager`: the model trains on the target device at all (DESIGN sections 1 and 5).

It runs the workspace recipe for STEPS optimizer steps on one repeated batch, through
titan_core's public `train.run`, and measures what the checklist judges (finite losses and
grad norms, the loss falling, step-1 loss near ln(vocab)) plus the baseline every later
rung compares with: step-1 loss and grad norm as exact repr floats, step time, tokens/s,
MFU and peak memory.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from onboard.errors import BadInput
from onboard.rungs.base import RungContext, RungResult

RUNG = "eager"
STEPS = 20
"""Optimizer steps of the gate: enough for the loss on a repeated batch to fall clearly."""
LOG_EVERY = 5


def _anchor(value: str, root: Path) -> str:
    """Recipe paths are relative to the workspace folder, wherever onboard runs from."""
    if not value:
        return value
    p = Path(value)
    return str(p if p.is_absolute() else (root / p).resolve())


def job_config(ctx: RungContext):
    """The workspace recipe, adjusted for the gate: STEPS steps (warmup capped at a quarter
    of them so the peak lr is reached), output in the attempt folder, nothing saved or
    profiled (the gate measures training, not checkpointing)."""
    from titan_core.config import ConfigError, load_config

    ws = ctx.workspace
    try:
        cfg = load_config(ws.recipe_path)
    except ConfigError as e:
        raise BadInput(f"{ws.recipe_path}: {e}") from None
    cfg.model.hf_config = _anchor(cfg.model.hf_config, ws.root)
    cfg.model.module_file = _anchor(cfg.model.module_file, ws.root)
    cfg.data.path = _anchor(cfg.data.path, ws.root)
    cfg.data.cache_dir = _anchor(cfg.data.cache_dir, ws.root)
    cfg.training.steps = STEPS
    cfg.lr_scheduler.warmup_steps = min(cfg.lr_scheduler.warmup_steps, STEPS // 4)
    cfg.checkpoint.enable = False
    cfg.checkpoint.export_hf = ""
    cfg.profiler.enable = False
    cfg.metrics.output_dir = str(ctx.attempt_dir)
    cfg.metrics.log_freq = LOG_EVERY
    cfg.metrics.rich = False
    return cfg


def files_read(ctx: RungContext, cfg) -> list[Path]:
    ws = ctx.workspace
    files = [ws.recipe_path]
    for value in (cfg.model.hf_config, cfg.model.module_file):
        if value:
            files.append(Path(value))
    if cfg.data.source == "text" and cfg.data.path and Path(cfg.data.path).is_file():
        files.append(Path(cfg.data.path))
    return files


def measure(rows: list[dict], vocab_size: int, num_params: int) -> dict:
    """Gate measurements from the per-step metric rows of one run."""
    losses = [r["loss"] for r in rows]
    norms = [r["grad_norm"] for r in rows]
    first, last = rows[0], rows[-1]
    ln_vocab = math.log(vocab_size)
    times = [r["step_time_s"] for r in rows]
    # the first steps pay for allocator warm-up and lazy init; leave them out of the speed numbers
    steady = rows[2:] if len(rows) > 4 else rows
    return {
        "steps_run": len(rows),
        "steps_planned": STEPS,
        "all_finite": len(rows) == STEPS and all(math.isfinite(x) for x in losses + norms),
        "step1_loss": first["loss"],
        "step1_loss_repr": repr(first["loss"]),
        "step1_grad_norm": first["grad_norm"],
        "step1_grad_norm_repr": repr(first["grad_norm"]),
        "last_loss": last["loss"],
        "last_loss_repr": repr(last["loss"]),
        "vocab_size": vocab_size,
        "ln_vocab": ln_vocab,
        "step1_loss_rel_to_ln_vocab": abs(first["loss"] - ln_vocab) / ln_vocab,
        "step_time_median_s": statistics.median(times[2:] if len(times) > 4 else times),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "mfu": statistics.median(r["mfu"] for r in steady),
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rows),
        "num_params": num_params,
    }


def run(ctx: RungContext) -> RungResult:
    from titan_core.config import ConfigError
    from titan_core.model_builder import resolve_model_args
    from titan_core.train import run as train_run

    cfg = job_config(ctx)
    try:
        vocab_size = resolve_model_args(cfg.model).vocab_size
    except ConfigError as e:
        raise BadInput(f"{ctx.workspace.recipe_path}: {e}") from None
    t = cfg.training
    ctx.log(
        f"eager: {STEPS} steps, batch {t.batch_size} x {t.seq_len} tokens, repeated, "
        f"{t.dtype}, device {cfg.device.type}; metrics -> {ctx.attempt_dir / 'metrics.jsonl'}"
    )
    try:
        result = train_run(cfg, repeat_batch=True)
    except ConfigError as e:
        raise BadInput(f"{ctx.workspace.recipe_path}: {e}") from None
    rows = result.metrics
    if not rows:
        raise RuntimeError("training ran no step")
    measurements = measure(rows, vocab_size, result.num_params)
    ctx.log(
        f"eager: loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f} over {len(rows)} steps, "
        f"{measurements['tokens_per_s']:,.0f} tokens/s"
    )
    return RungResult(
        measurements=measurements,
        files_read=files_read(ctx, cfg),
        # --dir makes it reproducible from any folder: the workspace lives at <dir>/onboarding/<name>
        command=f"onboard next-step {ctx.workspace.name} --dir {ctx.workspace.root.parent.parent}",
        details={
            "device": result.device,
            "loss_curve": [r["loss"] for r in rows],
            "grad_norm_curve": [r["grad_norm"] for r in rows],
            "batch_size": t.batch_size,
            "seq_len": t.seq_len,
            "dtype": t.dtype,
            "flops_per_token": result.flops_per_token,
            "swaps": dict(result.swaps),
            "metrics_file": ctx.workspace.key_for(ctx.attempt_dir / "metrics.jsonl"),
        },
    )
