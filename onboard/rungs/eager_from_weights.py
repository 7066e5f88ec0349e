"""A part of the eager rung (not a rung): a recipe that starts from a checkpoint (`checkpoint.initial_hf`).

Every run of such a recipe starts from those weights, loaded per rank by titan_core
(titan_core/training/hf_load.py). The eager rung then also checks that the load is the checkpoint
transformers reads: step 1's loss equals transformers' loss of the same folder (`from_pretrained`,
fp32, CPU, eager attention: onboard/upstream/hf_model.py) on the same batch, within the checklist's
bound (step1_loss_vs_transformers). The batch is the run's own first step, as its loader yields it on
rank 0 of 1 (`grad_accum` micro-batches, the loss their global token mean, plus the MoE load-balancing
term as transformers adds it); a packed batch is scored one document at a time, positions from 0. The
comparison is in fp32: a bf16 recipe's is the fp32 step the eager rung runs to measure its rounding.
Without initial_hf there is nothing to compare: the relative error is recorded as 0.0 and
`step1_loss_reference` says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from onboard.rungs import gate_recipe
from onboard.ladder.contract import ABSENT, RungContext
from onboard.ladder.measurements.training_measurements import EagerMeasurements
from onboard.parity.check import _upstream_aux
from onboard.upstream.hf_model import build_upstream
from titan_core.config import ConfigError
from titan_core.config.hf_config import read_hf_config
from titan_core.data import build_data_loader
from titan_core.data.base import IGNORE_INDEX
from titan_core.measure.numerics import rel
from titan_core.weights.header_check import INDEX, checkpoint_files as safetensors_of
import torch
import torch.nn.functional as F

CRITERION = "step1_loss_vs_transformers"
NOT_GIVEN = "none: the recipe has no checkpoint.initial_hf (a fresh init, judged by step1_loss_near_expected)"


def checkpoint_files(cfg) -> list[Path]:
    """The files of checkpoint.initial_hf that a run reads (config.json, the index, the safetensors the
    load reads: titan_core's `checkpoint_files`): their change makes the rung's evidence stale,
    wherever the folder is. None without initial_hf, or for a folder the load refuses (the run failed)."""
    if not cfg.checkpoint.initial_hf:
        return []

    folder = Path(cfg.checkpoint.initial_hf)
    try:
        shards = safetensors_of(folder)
    except ConfigError:
        return []
    return [p for p in (folder / "config.json", folder / INDEX) if p.is_file()] + shards


def _batches(cfg, args) -> list:
    """The micro-batches of the run's first optimizer step, as its loader yields them on rank 0 of 1."""
    loader = build_data_loader(cfg, vocab_size=args.vocab_size)
    return [next(loader) for _ in range(cfg.training.grad_accum)]


def _documents(batch):
    """(row, token indices) of each document of a packed micro-batch, in order."""
    for r in range(batch.tokens.shape[0]):
        seg = batch.segment_ids[r]
        for s in torch.unique_consecutive(seg):
            yield r, (seg == s).nonzero().flatten()


def transformers_loss(cfg, args) -> tuple[float, dict[str, Any]]:
    """(transformers' step-1 loss of checkpoint.initial_hf on the run's first step, how it was
    computed). UpstreamError (a ConfigError) when transformers cannot build or load it."""

    folder = Path(cfg.checkpoint.initial_hf)
    upstream = build_upstream(read_hf_config(folder / "config.json"), weights_dir=folder)
    model = upstream.model
    batches = _batches(cfg, args)
    ce_sum, valid, aux_terms, aux_how = 0.0, 0, [], ""
    with torch.no_grad():
        for b in batches:
            valid += int((b.labels != IGNORE_INDEX).sum())
            if b.segment_ids is None:
                out = model(input_ids=b.tokens, use_cache=False)
                for r in range(b.tokens.shape[0]):  # a row at a time: float64 logits of one row, not the batch's
                    ce_sum += F.cross_entropy(out.logits[r].double(), b.labels[r], ignore_index=IGNORE_INDEX,
                                              reduction="sum").item()  # fmt: skip
                aux, aux_how = _upstream_aux(model, out)
            else:
                aux = 0.0
                for r, idx in _documents(b):
                    out = model(input_ids=b.tokens[r, idx][None], position_ids=b.positions[r, idx][None],
                                use_cache=False)  # fmt: skip
                    ce_sum += F.cross_entropy(out.logits[0].double(), b.labels[r, idx], ignore_index=IGNORE_INDEX,
                                              reduction="sum").item()  # fmt: skip
                    if getattr(out, "aux_loss", None) is not None:
                        # routing statistics pool every token of the row, which no document-wise forward sees
                        aux, aux_how = math.nan, "packed documents through a load-balancing term: not comparable"
            aux_terms.append(aux)
    loss = ce_sum / max(valid, 1) + sum(aux_terms) / len(aux_terms)
    t = cfg.training
    how = {
        "checkpoint": str(folder),
        "model": type(model).__name__,
        "batch": f"{t.grad_accum} micro-batch(es) of {t.batch_size} x {t.seq_len} tokens, the run's step 1 (rank 0)",
        "packed": any(b.segment_ids is not None for b in batches),
        "valid_tokens": valid,
        "aux_term": aux_how or "none",
        "upstream_loading": upstream.counts(),
    }
    return loss, how


def step1_vs_transformers(ctx: RungContext, cfg, args, *, step1_loss: float,
                          rounding: EagerMeasurements) -> tuple[EagerMeasurements, dict]:  # fmt: skip
    """(the eager record's step1_loss_* part, details) of the comparison (module docstring). `step1_loss`: the
    recipe's step 1; `rounding`: a bf16 recipe's fp32 step (the rung's `bf16_rounding` part; without its
    fp32_step1_loss the bf16 run was not finite), whose loss is the one compared, in fp32. Where
    transformers' loss was computed it is also what step 1 should be (`checked_expected`)."""
    if not cfg.checkpoint.initial_hf:
        return EagerMeasurements(step1_loss_reference=NOT_GIVEN, step1_loss_vs_transformers_rel_err=0.0), {}

    if gate_recipe.precision(cfg.training) == "bf16":
        ours = rounding.fp32_step1_loss if rounding.fp32_step1_loss is not ABSENT else math.nan
        ours_from = "the fp32 step 1 of this bf16 recipe (same weights and batch; bf16_rounding)"
    else:
        ours, ours_from = step1_loss, "the recipe's step 1"
    bound = gate_recipe.bound("eager", CRITERION, "fp32", {})
    detail: dict[str, Any] = {"ours": ours, "ours_from": ours_from, "precision": "fp32", "bound": bound}
    ctx.log(f"eager: the run starts from {cfg.checkpoint.initial_hf}; transformers reads the same checkpoint")
    theirs, why = math.nan, None
    if args.kind.upstream != "transformers":
        kind = args.kind
        why = f"a {kind.name} model (a {kind.upstream} class): transformers has no causal-LM loss of it to compare"
    else:
        try:
            theirs, how = transformers_loss(cfg, args)
            detail.update(how)
        except ConfigError as e:  # UpstreamError: no transformers, no class for the model_type, a load that failed
            why = str(e)
    err = rel(ours, theirs)  # NaN on either side: inf, a failure
    detail.update(transformers=theirs, rel_err=err)
    if why:
        detail["why_not_compared"] = why
        ctx.log(f"eager: transformers' loss of the checkpoint could not be computed: {why}")
    verdict = "within" if err <= bound else "NOT within"
    ctx.log(f"eager: step-1 loss from the checkpoint: ours {ours!r} ({ours_from}), transformers {theirs!r}: "
            f"relative error {err:.2e}, {verdict} the fp32 bound {bound:.0e}")  # fmt: skip
    m = EagerMeasurements(
        step1_loss_reference=(
            f"transformers' loss of checkpoint.initial_hf ({cfg.checkpoint.initial_hf}) on the same batch"
        ),
        step1_loss_vs_transformers_rel_err=err,
        step1_loss_compared=ours,
        step1_loss_transformers=theirs,
    )
    return m, {"step1_vs_transformers": detail}


EXPECTED_IS = "transformers' loss of checkpoint.initial_hf on the same batch"
"""expected_step1_loss_is of a run from a checkpoint transformers scored: a trained checkpoint does not
predict uniformly, so what its step 1 should be is transformers' loss of it (`checked_expected`)."""


def checked_expected(m: EagerMeasurements) -> float | None:
    """transformers' step-1 loss of the checkpoint where it was computed (finite), from the part
    `step1_vs_transformers` returned; None: the model's own initial loss stands."""
    theirs = m.step1_loss_transformers
    return theirs if isinstance(theirs, float) and math.isfinite(theirs) else None
