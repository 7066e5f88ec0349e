"""A part of the eager rung (not a rung): the full-size model, checked without materialising it.

The eager rung trains the workspace's model, which is a twin when the full model does not fit here
(onboard/sizing/twin/setup.py); this probe checks the full model of config.json all the same, on the
meta device, so no byte of it is allocated:

- it builds: the recipe's [model] section with config.json as its architecture, as `onboard train`
  would build it there (the recipe's size overrides left out: they shape the model the rungs train);
- its size: parameters in total and active per token (titan_core's count_params), and the training
  FLOPs per token at the recipe's sequence length;
- its names: every state-dict tensor through the adapter's `to_hf`, name and shape, against the
  upstream class built on meta when the rungs run a twin; without a twin (parity then compares this
  very model with the upstream class), or without an upstream class, against the adapter's own round
  trip (`_round_trip`). A tied head is one tensor under two names (titan_core/models/common/tied.py);
- its checkpoint, with `--weights`: every tensor's name, shape and dtype from the safetensors headers
  alone (onboard/upstream/weights_headers.py), against the model on meta.

Counts of problems are what the checklist judges (0 each); a checkpoint not given has none to find,
and the measurements say it was not given. `probe` returns the full_model_* part of the eager rung's
record (EagerMeasurements), built by keyword.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from onboard.parity.diffusion import diffusers_model
from onboard.upstream.hf_model import UpstreamError, causal_lm, hf_config_object
from onboard.ladder.contract import RungContext
from onboard.ladder.measurements.training_measurements import EagerMeasurements
from onboard.upstream.weights_headers import check_checkpoint_headers
from titan_core.config.hf_config import read_hf_config
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import model_flops_per_token
from titan_core.models.common.tied import aliases, stored_once
from titan_core.models.model_builder import build_meta_model, model_adapter, resolve_model_args

LIST_CAP = 20
NATIVE = "the native model (through the adapter)"


@dataclass
class Layout:
    """The names of a state dict, a tied tensor's names told apart."""

    shapes: dict[str, tuple[int, ...]]
    """name -> shape of each tensor, under its first name only."""
    ties: dict[str, str]
    """alias -> the first name of the tensor it shares (a tied head -> the embedding)."""


def _layout(sd: dict) -> Layout:
    ties = aliases(sd)
    return Layout({k: tuple(v.shape) for k, v in sd.items() if k not in ties}, ties)


def _diff(ours: Layout, theirs: Layout, what: str) -> list[str]:
    """Names missing on either side, ties that differ and shapes that differ, one line each.
    A native alias absent from `theirs` is no difference (a checkpoint may store a tied head
    once: the tie fills it); a name `theirs` adds is one, alias or not (loading finds no place)."""
    out = _tie_diff(ours, theirs, what)
    told = {line.partition(":")[0] for line in out}
    mine, other = {*ours.shapes, *ours.ties}, {*theirs.shapes, *theirs.ties}
    out += [f"{k}: only in {what}" for k in sorted(other - mine - told)]
    out += [f"{k}: only in {NATIVE}" for k in sorted(set(ours.shapes) - other - told)]
    out += [f"{k}: native {list(ours.shapes[k])} vs {what} {list(theirs.shapes[k])}"
            for k in sorted(set(ours.shapes) & set(theirs.shapes)) if ours.shapes[k] != theirs.shapes[k]]  # fmt: skip
    return out


def _tie_diff(ours: Layout, theirs: Layout, what: str) -> list[str]:
    """A name that is an alias on one side and its own tensor (or another's alias) on the other."""
    out = []
    for k in sorted(set(ours.ties) | set(theirs.ties)):
        mine, other = ours.ties.get(k), theirs.ties.get(k)
        if mine is not None and other is not None and mine != other:
            out.append(f"{k}: tied to {mine} in {NATIVE}, to {other} in {what}")
        elif mine is not None and k in theirs.shapes:
            out.append(f"{k}: tied to {mine} in {NATIVE}, a tensor of its own in {what}")
        elif other is not None and k in ours.shapes:
            out.append(f"{k}: a tensor of its own in {NATIVE}, tied to {other} in {what}")
    return out


def _upstream_layout(hf_cfg: dict, upstream: str) -> tuple[Layout | None, str]:
    """(the layout of the upstream class built on meta, what it is), or (None, why not). `upstream`:
    the library whose class the model ports (its args' `kind.upstream`)."""
    try:
        with torch.device("meta"):
            if upstream == "diffusers":
                model = diffusers_model(hf_cfg)
            else:
                model = causal_lm(hf_config_object(hf_cfg))
    except (UpstreamError, ValueError) as e:  # no transformers or diffusers, or no class for this model_type
        return None, str(e)
    return _layout(model.state_dict(keep_vars=True)), f"the upstream {type(model).__name__} built on meta"


def probe(ctx: RungContext, cfg) -> tuple[EagerMeasurements, dict[str, Any]]:
    """(the full_model_* part of the eager record, details) of the full model of the workspace's config.json
    (module docstring)."""
    ws = ctx.workspace
    full_cfg = copy.deepcopy(cfg.model)
    if ws.hf_config_path is not None:
        full_cfg.hf_config = str(ws.hf_config_path)
    # config.json as written: a recipe override of a size (n_layers = 2 while debugging) shapes the
    # model the rungs train, not the full model; a port's `extra` fields are kept (its model.py reads them)
    ignored = {k: v for k, v in full_cfg.overrides.items() if k != "extra"}
    full_cfg.overrides = {k: v for k, v in full_cfg.overrides.items() if k == "extra"}
    details: dict[str, Any] = {"config": ws.key_for(ws.hf_config_path) if ws.hf_config_path else "the recipe's flavor"}
    if ignored:
        details["overrides_not_applied"] = ignored
    try:
        args = resolve_model_args(full_cfg)
        model = build_meta_model(full_cfg, args)
        adapter = model_adapter(full_cfg)
        native = model.state_dict(keep_vars=True)  # Parameters: a tied one is one object on meta too
        hf = adapter.to_hf(native)
    except Exception as e:  # the workspace's adapter or model.py raised: the gate fails and names it
        details["error"] = f"{type(e).__name__}: {e}"
        ctx.log(f"eager: the full model does not build on meta: {details['error']}")
        return EagerMeasurements(full_model_built_on_meta=False, full_model_runs_as=ws.model_label()), {
            "full_model": details}
    counts = count_params(model)
    # a model whose samples have a size of their own (flux: its full-size image) is counted at it,
    # not at the recipe's (the twin's) seq_len
    sample_len = args.sample_spec().seq_len
    if ws.twin_path is not None:
        theirs, why = _upstream_layout(_full_hf_config(ws, adapter, args), args.kind.upstream)
        why = why if theirs is not None else f"no upstream class: {why}"
    else:  # no twin: parity compares this very model with the upstream class, tensor by tensor
        theirs, why = None, "no twin: parity compares this model with the upstream class itself"
    if theirs is None:
        try:
            mismatches = _round_trip(adapter, native, hf)
        except Exception as e:  # the workspace adapter's from_hf raised: named, the gate fails
            mismatches = [f"adapter.from_hf raised {type(e).__name__}: {e}"]
        reference = f"the adapter's round trip ({why})"
    else:
        reference = why
        mismatches = _diff(_layout(hf), theirs, "upstream")
    details["key_mismatches"] = mismatches[:LIST_CAP]
    checkpoint = _checkpoint(ws, model, adapter, details)
    m = EagerMeasurements.from_parts(
        checkpoint,
        full_model_built_on_meta=True,
        full_model_runs_as=ws.model_label(),
        full_model_params_total=counts.total,
        full_model_params_active=counts.active,
        # a model that counts its own (flux: per image token of its full-size sample) knows better
        full_model_flops_per_token=model_flops_per_token(model, cfg.training.seq_len),
        full_model_seq_len=sample_len or cfg.training.seq_len,
        full_model_key_mismatches=len(mismatches),
        full_model_keys_reference=reference,
        full_model_tensors=len(hf),
    )
    ctx.log(
        f"eager: full model on meta: {counts.total:,} parameters ({counts.active:,} active per token), "
        f"{len(hf)} tensors, {len(mismatches)} name/shape mismatches against {reference}; "
        f"checkpoint: {m.full_model_checkpoint}"
    )
    return m, {"full_model": details}


def _round_trip(adapter, native: dict, hf: dict) -> list[str]:
    """HF names -> native again, against the model's own state dict: what loading a checkpoint
    of these names gives (each tensor stored once) and, for a tied model, HF's in-memory dict."""
    forms = {"the round trip": _fresh_meta(stored_once(hf))}
    if aliases(hf):
        forms["the round trip of HF's in-memory dict"] = _fresh_meta(hf)
    ours = _layout(native)
    out: list[str] = []
    for what, checkpoint in forms.items():
        told = {line.partition(":")[0] for line in out}  # a name wrong in both forms is one mismatch
        out += [line for line in _diff(ours, _layout(adapter.from_hf(checkpoint)), what)
                if line.partition(":")[0] not in told]  # fmt: skip
    return out


def _fresh_meta(sd: dict) -> dict:
    """New meta tensors of the same shapes, one per tensor: a shared one stays shared, as HF holds it."""
    ties = aliases(sd)
    out = {k: torch.empty(tuple(v.shape), device="meta") for k, v in sd.items() if k not in ties}
    return {k: out[ties[k]] if k in ties else out[k] for k in sd}


def _full_hf_config(ws, adapter, args) -> dict:
    """The full model's HF config: config.json, or a preset workspace's family export."""
    if ws.hf_config_path is not None:
        return read_hf_config(ws.hf_config_path)
    return adapter.hf_config(args)


def _checkpoint(ws, model, adapter, details: dict) -> EagerMeasurements:
    """The full_model_checkpoint_* part: the header check of the --weights checkpoint against the full
    model; 0 problems without one."""
    if ws.weights_dir is None:
        return EagerMeasurements(full_model_checkpoint="no --weights given", full_model_checkpoint_problems=0)

    try:
        report = check_checkpoint_headers(ws.weights_dir, model, adapter)
    except UpstreamError as e:  # a folder that holds no checkpoint: one problem, named
        details["checkpoint"] = {"error": str(e)}
        return EagerMeasurements(full_model_checkpoint=str(e), full_model_checkpoint_problems=1)
    kinds = ("missing", "extra", "wrong_shape", "wrong_dtype", "problems")
    found = report.to_dict()
    for kind in kinds:
        found[kind] = found[kind][:LIST_CAP]  # the counts are in the measurements
    details["checkpoint"] = found
    return EagerMeasurements(
        full_model_checkpoint=report.summary(),
        full_model_checkpoint_problems=sum(len(getattr(report, k)) for k in kinds),
        full_model_checkpoint_missing=len(report.missing),
        full_model_checkpoint_extra=len(report.extra),
        full_model_checkpoint_wrong_shape=len(report.wrong_shape),
        full_model_checkpoint_wrong_dtype=len(report.wrong_dtype),
        # the report's "problems" (file and index integrity), named so as not to shadow the total
        full_model_checkpoint_file_problems=len(report.problems),
        full_model_checkpoint_bytes_read=report.bytes_read,
        full_model_checkpoint_bytes_declared=report.data_bytes,
    )
