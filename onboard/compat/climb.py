"""One architecture's probe: its tiny config, a real workspace (`new-model --path transformers`) in a
temporary folder, then the engine's `next_step` until the ladder is complete or a rung stops it;
each rung's cell (`cells_of`) is read back from the ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from onboard.compat.causal import check_causal
from onboard.compat.tiny import MAX_PARAMS, SEQ_LEN, NotProbed, one_line, tiny_config
from onboard.ladder.table import default_specs
from onboard.ladder.states import current_state, entry_error, ladder_states
from onboard.engine.next_step import next_step
from onboard.errors import BadInput
from onboard.ladder.contract import SHIPPED
from onboard.rungs import timing_profiles
from onboard.workspace.layout import Workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.ledger import ACCEPTED, Status

TIMING_PROFILE = "quick"
"""The timing profile every probe's rungs time their keep/choose decisions with
(timing_profiles.TIMING_PROFILES): compat asks whether each rung passes on an architecture, not which flag
is fastest on this CPU. Criteria, thresholds and every other param stay as shipped, and every
attempt's details say the profile (`timing_profile`)."""
QUICK_TIMING = timing_profiles.TIMING_PROFILES[TIMING_PROFILE]
"""What that profile sets over the checklists' `params.timing` (the table's header quotes it)."""
TELLING = ("capture_error", "first_break", "first_host_sync", "features_idle", "error")
"""Measurements that say more than the criterion they fail, in the order the reason prefers them."""


def rungs() -> list[str]:
    """The engine's rungs, in ladder order."""
    return [spec.name for spec in default_specs()]


def probe(
    model_type: str,
    work: Path,
    *,
    log: Callable[[str], None] = lambda s: None,
    save: Callable[[dict], None] = lambda row: None,
    detail: Callable[[str], None] = lambda s: None,
) -> dict:
    """{"cells": {rung: cell}, "params": n} or {"not_probed": why}, climbed in this process under `work`
    with the TIMING_PROFILE; `save(row)` after every step, so a crash or a kill later keeps the cells
    already recorded. `log` gets a line per rung, `detail` the rungs' own log."""
    try:
        ws, n_params = scaffold(model_type, work)
    except NotProbed as e:
        return {"not_probed": one_line(str(e))}
    row: dict[str, Any] = {"cells": {}, "params": n_params}
    for cells in climb(ws, log=lambda line: log(f"compat: {model_type}: {line}"), detail=detail,
                       timing_profile=TIMING_PROFILE):
        row["cells"] = cells
        save(row)
    return row


def scaffold(model_type: str, work: Path):
    """(the scaffolded Workspace, parameter count or None); NotProbed where the class is not a causal
    LM (`check_causal`) or new-model refuses the config."""
    cfg = tiny_config(model_type)
    check_causal(cfg)
    cfg_path = work / "config.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    name = "compat_" + "".join(c if c.isalnum() else "_" for c in model_type)
    try:
        plan = plan_workspace(name, work, hf_config=cfg_path, path="transformers", device="cpu")
    except BadInput as e:
        # the temporary folder's path says nothing in a table
        raise NotProbed(f"new-model --path transformers refuses it: {str(e).replace(f'{work}/', '')}") from None
    n_params = _param_count(plan)
    if n_params is not None and n_params > MAX_PARAMS:
        raise NotProbed(f"the tiny config still has {n_params / 1e6:.0f}M parameters (sizes the probe does not shrink)")
    plan.files["recipe.toml"] = plan.files["recipe.toml"].replace("seq_len = 128", f"seq_len = {SEQ_LEN}")
    write_workspace(plan)
    return Workspace.load(work, name), n_params


def _param_count(plan) -> int | None:
    """Parameters of the workspace's model, built on meta; None when it cannot be built (the eager
    rung then fails on it, with the error, like any workspace's)."""
    from titan_core.models.transformers import ADAPTER, TransformersCausalLM  # lazy: transformers, an optional extra

    try:
        args = ADAPTER.args_from_hf(plan.hf_config)[0]
        with torch.device("meta"):
            model = TransformersCausalLM(args)
        return sum(p.numel() for p in model.parameters())
    except Exception:  # noqa: BLE001 -- the eager rung records this error
        return None


def climb(
    ws,
    *,
    log: Callable[[str], None] = lambda s: None,
    detail: Callable[[str], None] = lambda s: None,
    max_steps: int | None = None,
    timing_profile: str = SHIPPED,
):
    """Yield the cells after every `next_step` until the ladder is complete or a step does not pass.

    `max_steps` (default three per rung) bounds a ladder that keeps re-verifying after recipe edits.
    An error the engine raises instead of recording (bad input found by a rung, a rung that cannot be
    imported) fails the rung it was on. `timing_profile`: what the rungs time their decisions with.
    """
    specs = default_specs()
    max_steps = max_steps or 3 * len(specs)
    for _ in range(max_steps):
        if (state := current_state(ladder_states(ws, specs))) is None:
            return
        current = state.rung
        try:
            status, raised = str(next_step(ws, specs=specs, log=detail, timing_profile=timing_profile).status), None
        except Exception as e:  # noqa: BLE001 -- this architecture's failure, not the sweep's
            # the temporary workspace's path says nothing in a table: its files by their names
            status, raised = "raised", (current, f"{type(e).__name__}: {e}".replace(f"{ws.root}/", ""))
        cells = cells_of(ladder_states(ws, specs), raised=raised)
        yield cells
        cell = cells[current]
        log(f"{current} {cell['status']}" + (f" ({cell['seconds']} s)" if "seconds" in cell else ""))
        if status not in ACCEPTED:
            return
    yield cells_of(ladder_states(ws, specs), cap=max_steps)


def cells_of(states, *, raised: tuple[str, str] | None = None, cap: int | None = None) -> dict[str, dict]:
    """{rung: {"status", "reason"[, "seconds"]}} from the engine's rung states (the ledger's latest
    attempts); `raised` = (rung, error) the engine raised on, `cap` = the step bound the climb hit."""
    cells: dict[str, dict] = {}
    stopper = None
    for s in states:
        status, latest = str(s.status), s.latest or {}
        if raised and s.rung == raised[0]:
            cell = {"status": "fail", "reason": one_line(raised[1])}
        elif stopper:
            cell = {"status": "not_reached", "reason": f"the {stopper} rung failed"}
        elif status == Status.PASSED:
            cell = {"status": "pass", "reason": ""}
        elif status == Status.NOT_APPLICABLE:
            cell = {"status": "not_applicable", "reason": one_line(s.reason or "")}
        elif status in (Status.FAILED, Status.INTERRUPTED):
            cell = {"status": "fail", "reason": failure_reason(latest)}
        elif cap and status in (Status.STALE, Status.INVALID):
            cell = {"status": "not_reached", "reason": one_line(f"{status} after {cap} steps: {s.reason}")}
        else:  # pending (the climb ended before it), or not built in this version of onboard
            cell = {"status": "not_reached", "reason": status}
        if cell["status"] == "fail":
            stopper = s.rung
        if latest.get("duration_s") is not None and cell["status"] != "not_reached":
            cell["seconds"] = round(float(latest["duration_s"]), 1)
        cells[s.rung] = cell
    return cells


def failure_reason(entry: dict) -> str:
    """One line: the error the attempt hit, else its first failed criterion (with a telling
    measurement where the rung took one)."""
    error = entry_error(entry)  # parity's {kind, message} of the port's own error among them
    if error:
        return one_line(str(error).split(" (traceback: ")[0])
    bad = next((c for c in entry.get("criteria") or [] if not c.get("ok")), None)
    if bad is None:
        return one_line(f"{entry.get('status')} with every criterion met")
    value, thr = bad.get("value"), bad.get("threshold")
    m = entry.get("measurements") or {}
    extra = next((f"{k}: {m[k]}" for k in TELLING if m.get(k)), "")
    if bad.get("comparator") == "is_true" or value is None:
        # a yes/no criterion: the telling measurement says what failed; the checklist's hint, only
        # where none was taken (the hint is long, and the line is cut to one screen line)
        return one_line(f"{bad['name']}: {extra or bad.get('hint')}")
    why = f"{bad['name']}: {value!r} (needs {bad['comparator']} {thr!r})"
    return one_line(f"{why}; {extra}" if extra and extra not in why else why)
