"""Will the full model train on the device a new workspace is set up for? `new-model` asks.

The answer comes from titan_core's memory model (titan_core/memory_estimate.py), the one the
trainer refuses oversized runs with, applied to the workspace's own recipe and the model
built on the meta device: `new-model` warns of what `next-step` would refuse.
"""

from __future__ import annotations

import tomllib

TWIN_NOTE = "a smaller twin for the CPU gates is not built yet (issue 'real-size models')"


def fit_warning(hf_config: dict, family: str, *, recipe_text: str) -> str | None:
    """One warning line when the model of `hf_config` (read by `family`'s adapter) cannot train as
    `recipe_text` (the workspace's recipe.toml) sets it up, on the device it names; else None.

    None too when nothing can be said: the adapter cannot read the config (a port's TODO), or
    the device's memory is unknown here (a TPU whose kind nothing names, a GPU on a host without one).
    """
    import torch  # import-time cost: torch and the model classes load only when new-model asks

    from titan_core.config import from_dict
    from titan_core.device_budget import device_budget
    from titan_core.memory_check import estimate_for
    from titan_core.memory_estimate import format_bytes
    from titan_core.models import get_family
    from titan_core.models.common.hf_adapter import AdapterError
    from titan_core.models.registry import build_meta

    cfg = from_dict(tomllib.loads(recipe_text))
    try:
        args, _ = get_family(family).adapter.args_from_hf(hf_config)
    except (AdapterError, TypeError, ValueError):
        return None
    device = cfg.device.type
    if device == "auto":  # as titan_core.devices.resolve_device decides it, without starting a device
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available() and not cfg.device.memory_budget_gib:
        return None  # set up on one machine for another: this one cannot say what that GPU has free
    budget = device_budget(device, override_gib=cfg.device.memory_budget_gib)
    if budget is None:
        return None
    _, _, est = estimate_for(cfg, build_meta(family, args), args, device)
    if est.total <= budget.bytes:
        return None
    note = f"; {TWIN_NOTE}" if device == "cpu" else ""
    return (
        f"the full model cannot train on {device} as this workspace is set up: {est.describe()}; "
        f"the budget is {format_bytes(budget.bytes)} ({budget.source}), so next-step will refuse it{note}"
    )
