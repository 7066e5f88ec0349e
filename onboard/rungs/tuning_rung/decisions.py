"""The tuning rung's keep rule and the Decision each change it tried records (one per change:
the change is the candidate, the recipe it would change the holder). Beside tuning_rung/rung.py to
keep that module short. Not a rung (no RUNG).

A change takes the lever only when `decision.decide` keeps it (its per-token timing against the
holder is `faster`, an interval wholly on its side) and its numerics allow: a diverged change is
not eligible and never timed; a faster rounding change whose loss curve left the holder's is not
eligible either, its timing kept in the record.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from onboard.ladder import decision
from titan_core.config.loader import get_key
from onboard.rungs.tuning_rung.search import BatchShape

RUNG = "tuning"
BATCH_LEVER = "training.batch_size"
"""The lever a batch change is recorded under; its values are BatchShape labels (rows x grad_accum)."""


def _outcome(cmp) -> str:
    return decision.outcome_of(cmp.to_dict()) if cmp is not None else decision.NOT_MEASURED


def keep_rule(cls, cmp, curve) -> tuple[bool, str]:
    """(kept, why) of one change from its class, its timing (None: not timed) and its curve check."""
    if cls.rejected:
        return False, f"rejected: {cls.why}"
    outcome = _outcome(cmp)
    if outcome != "faster":
        return False, f"not faster, the recipe stays ({outcome if cmp else 'not timed'})"
    if cls.cls == "rounding" and (curve is None or not curve.ok):
        return False, f"faster but a rounding change, and its {curve.describe() if curve else 'curve was not run'}"
    return True, f"faster, {cls.cls.replace('_', '-')}" + (f"; {curve.describe()}" if curve else "")


def lever_of(step: str, label: str, values: dict, holder_cfg) -> tuple[str, Any, Any, str]:
    """(lever, holder value, candidate value, recipe key whose writer the holder names) of one change."""
    if step == "batch":
        shape = BatchShape(values["training.batch_size"], values["training.grad_accum"]).label()
        t = holder_cfg.training
        return BATCH_LEVER, BatchShape(t.batch_size, t.grad_accum).label(), shape, BATCH_LEVER
    if len(values) == 1:
        (key, value), = values.items()
        return key, get_key(holder_cfg, key), value, key
    # a flag that sets several keys (or none): the flag is the lever, on against off
    return label, "off", "on", next(iter(values), label)


def change_decision(ledger, *, step: str, label: str, values: dict, holder_cfg, holder_label: str, cls, cmp, kept: bool,
                    why: str) -> decision.Decision:  # fmt: skip
    """The Decision of one change tried against the recipe it would change (`holder_cfg`, labelled
    `holder_label`), from what the keep rule saw: its class, its timing, `kept` and `why`."""
    lever, holder, candidate, key = lever_of(step, label, values, holder_cfg)
    what = f"{label} (against {holder_label})"
    if cls.rejected or cmp is None:
        verdict = decision.NOT_ELIGIBLE if cls.rejected else decision.NOT_MEASURED
        return decision.Decision(rung=RUNG, lever=lever, holder=holder, candidate=candidate, value=holder,
                                 verdict=verdict, figure="none", why=f"{what}: {why}; {holder} stands")  # fmt: skip
    d = decision.decide(RUNG, lever, holder=holder, candidate=candidate, comparison=cmp.to_dict(),
                        set_by=decision.holder_set_by(ledger, key), what=what)  # fmt: skip
    if d.verdict == decision.KEPT and not kept:  # faster, but a rounding change whose curve left the holder's
        d = dataclasses.replace(d, verdict=decision.NOT_ELIGIBLE, value=holder, reverses=None,
                                why=f"{d.why}; not eligible: {why}; {holder} stands")  # fmt: skip
    return d
