"""The tuning rung's activation-checkpointing step: recompute for a larger batch, tried only where
memory ended the batch search.

Activation checkpointing (titan_core/parallel/activation_checkpoint.py) buys memory with compute; its
only worth is the batch the memory buys. So it is tried only when memory stopped the batch search
(`SearchResult.stopped == "memory"`): at the batch the next doubling would have been, with each mode
in turn, the milder first (`selective` per op, then `full`). Each mode is first proved at the holder's
own batch: the same rows, so its step 1 must be the holder's (fp32: bit for bit; bf16: within the
gate's bound). Then, at the larger batch, its measured peak must fit the search's limit, and it is
timed per token against the holder and kept by the keep rule like every other change. The first mode
kept ends the step. The Graph Trainer's own memory policy decides for a captured step: not tried there.
"""

from __future__ import annotations

from titan_core.config.loader import with_keys
from titan_core.config.execution_modes import execution_mode
from titan_core.memory.estimate import format_bytes

from onboard.rungs.tuning_rung.search import BatchShape

STEP = "activation_checkpoint"
MODES = ("selective", "full")
"""Tried in this order: selective keeps matmul, attention and collective outputs (less recompute)."""
EXACT = {"fp32": ("bit_identical",), "bf16": ("bit_identical", "rounding")}
"""The classes a mode may have at the holder's own batch, per precision: recompute runs the same ops."""


def bigger(shape: BatchShape, fixed_global: bool) -> BatchShape | None:
    """The batch the next doubling would have been (None: a fixed global batch of one micro-batch cannot)."""
    if fixed_global:
        return BatchShape(shape.batch_size * 2, shape.grad_accum // 2) if shape.grad_accum % 2 == 0 else None
    return BatchShape(shape.batch_size * 2, shape.grad_accum)


def try_checkpointing(tuner, batch: dict, *, fixed_global: bool, precision: str) -> dict:
    """The step (module docstring) on tuning_rung's Tuner `tuner` (its holder, runs, classify, trial and notes):
    {tried, why, modes: {mode: {same_batch_class, peak_bytes, kept, why}}}."""
    out: dict = {"tried": False, "why": "", "modes": {}}
    if execution_mode(tuner.cfg) == "graph_trainer":
        out["why"] = "the Graph Trainer's memory policy decides what a captured step saves"
    elif batch["stopped"] != "memory":
        out["why"] = f"memory did not end the batch search (it stopped on {batch['stopped']}): no batch to buy"
    if out["why"]:
        tuner.note(STEP, "activation_checkpoint.mode", out["why"])
        return out
    t = tuner.cfg.training
    shape = bigger(BatchShape(t.batch_size, t.grad_accum), fixed_global)
    if shape is None:
        out["why"] = f"the recipe fixes its global batch at {t.batch_size} rows in one micro-batch: no larger batch"
        tuner.note(STEP, "activation_checkpoint.mode", out["why"])
        return out
    out["tried"], limit = True, batch["limit_bytes"]
    for mode in MODES:
        row = _mode(tuner, mode, shape, limit, precision)
        out["modes"][mode] = row
        if row["kept"]:
            break
    out["why"] = f"memory ended the batch search at {format_bytes(limit)}: batch {shape.label()} with recompute"
    return out


def _mode(tuner, mode: str, shape: BatchShape, limit: int, precision: str) -> dict:
    key = {"activation_checkpoint.mode": mode}
    same = f"ac={mode}"
    cfg = with_keys(tuner.cfg, key)
    tuner.runs.probe(same, cfg)
    cls, _ = tuner.classify(same, cfg, tuner.holder, tuner.cfg)
    row = {"same_batch_label": same, "same_batch_class": cls.cls, "same_batch": cls.to_dict(), "kept": False}
    if cls.cls not in EXACT[precision]:
        row["why"] = f"at the holder's own batch its step 1 is {cls.cls}, not {' or '.join(EXACT[precision])}"
        tuner.ctx.log(f"tuning: {STEP}: {same}: {row['why']}: not tried larger")
        tuner.runs.keep_only(tuner.holder)
        return row
    tuner.ctx.log(f"tuning: {STEP}: {same} at the holder's batch: {cls.cls} (numerics unchanged)")
    values = {**key, "training.batch_size": shape.batch_size, "training.grad_accum": shape.grad_accum}
    label = f"ac={mode},batch={shape.label()}"
    tuner.runs.probe(label, with_keys(tuner.cfg, values))
    row.update(label=label, peak_bytes=tuner.runs.peak.get(label), limit_bytes=limit)
    if row["peak_bytes"] is not None and row["peak_bytes"] > limit:
        row["why"] = f"peak {format_bytes(row['peak_bytes'])} is over the limit {format_bytes(limit)}: not timed"
        tuner.notes.append({"step": STEP, "what": label, "why": row["why"], "peak_bytes": row["peak_bytes"]})
        tuner.ctx.log(f"tuning: {STEP}: {label}: {row['why']}")
        tuner.runs.keep_only(tuner.holder)
        return row
    change = tuner.trial(STEP, label, values)  # timed per token against the holder, kept by the keep rule
    row.update(kept=change["kept"], why=change["why"], **{"class": change["class"]})
    return row


def kept_not_exact(result: dict, precision: str) -> int:
    """Modes kept whose step 1 at the holder's own batch was not an allowed class (the gate's count; 0)."""
    return sum(r["kept"] and r["same_batch_class"] not in EXACT[precision] for r in result["modes"].values())
