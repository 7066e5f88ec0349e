"""The full-size model, checked without materialising it: a part of the eager rung.

Not a rung (no RUNG). The eager rung trains the workspace's model, which is a twin when the
full model does not fit here (onboard/sizing/twin_setup.py); this probe checks the full model of
config.json all the same, on the meta device, so no byte of it is allocated:

- it builds: the recipe's [model] section with config.json as its architecture, through the
  workspace adapter and (a port) model.py, as `onboard train` would build it there (the
  recipe's size overrides left out: they shape the model the rungs train, not config.json's);
- its size: parameters in total and active per token (titan_core's count_params), and the
  training FLOPs per token at the recipe's sequence length;
- its names: every state-dict tensor through the adapter's `to_hf`, name and shape, against
  the upstream transformers class built on meta from the same config.json when the rungs run
  a twin; without a twin (parity then compares this very model with the upstream class) and
  where transformers has no class for it, against the adapter's own round trip, saying so;
- its checkpoint, with `--weights`: every tensor's name, shape and dtype from the
  safetensors headers alone (onboard/sizing/weights_headers.py), against the model on meta.

Counts of problems are what the checklist judges (0 each); a checkpoint not given has none
to find, and the measurements say it was not given.
"""

from __future__ import annotations

import copy
from typing import Any

from onboard.rungs.contract import RungContext

LIST_CAP = 20


def _shapes(sd: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items()}


def _diff(ours: dict[str, tuple], theirs: dict[str, tuple], what: str) -> list[str]:
    """Names missing on either side, and shapes that differ, as one line each."""
    out = [f"{k}: only in {what}" for k in sorted(set(theirs) - set(ours))]
    out += [f"{k}: only in the native model (through the adapter)" for k in sorted(set(ours) - set(theirs))]
    out += [f"{k}: native {list(ours[k])} vs {what} {list(theirs[k])}" for k in sorted(set(ours) & set(theirs))
            if ours[k] != theirs[k]]  # fmt: skip
    return out


def _upstream_shapes(hf_cfg: dict) -> tuple[dict[str, tuple] | None, str]:
    """(name -> shape of the upstream class built on meta, what it is), or (None, why not)."""
    import torch

    from onboard.parity.upstream import UpstreamError, hf_config_object

    try:
        config = hf_config_object(hf_cfg)
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (UpstreamError, ValueError) as e:  # no transformers, or no class for this model_type
        return None, str(e)
    return _shapes(model.state_dict()), f"the upstream {type(model).__name__} built on meta"


def probe(ctx: RungContext, cfg) -> tuple[dict[str, Any], dict[str, Any]]:
    """(measurements, details) of the full model of the workspace's config.json (module docstring)."""
    from titan_core.training.model_builder import build_meta_model, model_adapter, resolve_model_args
    from titan_core.models.common.param_counts import count_params
    from titan_core.models.common.stats import flops_per_token

    ws = ctx.workspace
    full_cfg = copy.deepcopy(cfg.model)
    if ws.hf_config_path is not None:
        full_cfg.hf_config = str(ws.hf_config_path)
    # config.json as written: a recipe override of a size (n_layers = 2 while debugging) shapes the
    # model the rungs train, not the full model; a port's `extra` fields are kept (its model.py reads them)
    ignored = {k: v for k, v in full_cfg.overrides.items() if k != "extra"}
    full_cfg.overrides = {k: v for k, v in full_cfg.overrides.items() if k == "extra"}
    m: dict[str, Any] = {"full_model_built_on_meta": False, "full_model_runs_as": ws.model_label()}
    details: dict[str, Any] = {"config": ws.key_for(ws.hf_config_path) if ws.hf_config_path else "the recipe's flavor"}
    if ignored:
        details["overrides_not_applied"] = ignored
    try:
        args = resolve_model_args(full_cfg)
        model = build_meta_model(full_cfg, args)
        adapter = model_adapter(full_cfg)
        ours = _shapes(adapter.to_hf(model.state_dict()))
    except Exception as e:  # the workspace's adapter or model.py raised: the gate fails and names it
        details["error"] = f"{type(e).__name__}: {e}"
        ctx.log(f"eager: the full model does not build on meta: {details['error']}")
        return m, {"full_model": details}
    counts = count_params(model)
    m.update(
        full_model_built_on_meta=True,
        full_model_params_total=counts.total,
        full_model_params_active=counts.active,
        full_model_flops_per_token=flops_per_token(args, cfg.training.seq_len),
        full_model_seq_len=cfg.training.seq_len,
    )
    if ws.twin_path is not None:
        theirs, why = _upstream_shapes(_full_hf_config(ws, adapter, args))
        why = why if theirs is not None else f"no upstream class: {why}"
    else:  # no twin: parity compares this very model with the upstream class, tensor by tensor
        theirs, why = None, "no twin: parity compares this model with the upstream class itself"
    if theirs is None:  # HF names -> native again: what loading a checkpoint of these names would give
        back = _shapes(adapter.from_hf({k: _meta(v) for k, v in ours.items()}))
        mismatches = _diff(_shapes(model.state_dict()), back, "the round trip")
        reference = f"the adapter's round trip ({why})"
    else:
        reference = why
        mismatches = _diff(ours, theirs, "upstream")
    m.update(full_model_key_mismatches=len(mismatches), full_model_keys_reference=reference,
             full_model_tensors=len(ours))  # fmt: skip
    details["key_mismatches"] = mismatches[:LIST_CAP]
    m.update(_checkpoint(ws, model, adapter, details))
    ctx.log(
        f"eager: full model on meta: {counts.total:,} parameters ({counts.active:,} active per token), "
        f"{len(ours)} tensors, {len(mismatches)} name/shape mismatches against {reference}; "
        f"checkpoint: {m['full_model_checkpoint']}"
    )
    return m, {"full_model": details}


def _meta(shape: tuple[int, ...]):
    import torch

    return torch.empty(shape, device="meta")


def _full_hf_config(ws, adapter, args) -> dict:
    """The full model's HF config: config.json, or a preset workspace's family export."""
    from titan_core.config.hf_config import read_hf_config

    if ws.hf_config_path is not None:
        return read_hf_config(ws.hf_config_path)
    return adapter.hf_config(args)


def _checkpoint(ws, model, adapter, details: dict) -> dict[str, Any]:
    """The header check of the --weights checkpoint against the full model; 0 problems without one."""
    if ws.weights_dir is None:
        return {"full_model_checkpoint": "no --weights given", "full_model_checkpoint_problems": 0}
    from onboard.parity.upstream import UpstreamError
    from onboard.sizing.weights_headers import check_checkpoint_headers

    try:
        report = check_checkpoint_headers(ws.weights_dir, model, adapter)
    except UpstreamError as e:  # a folder that holds no checkpoint: one problem, named
        details["checkpoint"] = {"error": str(e)}
        return {"full_model_checkpoint": str(e), "full_model_checkpoint_problems": 1}
    kinds = ("missing", "extra", "wrong_shape", "wrong_dtype", "problems")
    found = report.to_dict()
    for kind in kinds:
        found[kind] = found[kind][:LIST_CAP]  # the counts are in the measurements
    details["checkpoint"] = found
    return {
        "full_model_checkpoint": report.summary(),
        "full_model_checkpoint_problems": sum(len(getattr(report, k)) for k in kinds),
        # one count per kind; "problems" (file and index integrity) as file_problems, not to shadow the total
        **{f"full_model_checkpoint_{'file_problems' if k == 'problems' else k}": len(getattr(report, k))
           for k in kinds},
        "full_model_checkpoint_bytes_read": report.bytes_read,
        "full_model_checkpoint_bytes_declared": report.data_bytes,
    }
