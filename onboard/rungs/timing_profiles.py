"""The timing profiles a rung's keep/choose decisions may be timed with, by name: what each sets
over the checklists' `params.timing`. `shipped` (the default) is the checklists' own protocol, the
one a ladder is meant to run; `quick` stops each comparison after a few rounds, for runs that ask
whether each rung passes, not which flag is fastest on this machine (`onboard compat`, tests of the
ladder's mechanics). Only `params.timing` changes: criteria, thresholds and every other param stay
as shipped.

The profile is an argument, never process state: `next_step(..., timing_profile=...)` puts it on the
attempt's `RungContext.timing_profile`, a rung times with `protocol(rung, ctx.timing_profile)`, and
the engine records it in the attempt's details (`timing_record`), so a quick decision is never read
as the shipped protocol's.
"""

from __future__ import annotations

from typing import Any

from onboard.ladder.contract import SHIPPED
from onboard.rungs.gate_recipe import checklist
from titan_core.measure.timing import TimingProtocol

TIMING_PROFILES: dict[str, dict[str, Any]] = {
    SHIPPED: {},
    # quick runs (tests, `onboard compat` beside other jobs): their decisions are recorded as quick
    # and decide nothing a person relies on
    "quick": {
        "warmup": 1,
        "min_rounds": 2,
        "max_rounds": 3,
        "max_seconds": 2.0,
    },
}
"""Each profile's settings over the checklist's `params.timing` (SHIPPED: none)."""


def check_profile(name: str) -> str:
    """`name`, where it is a profile; ValueError naming the known ones where not."""
    if name not in TIMING_PROFILES:
        raise ValueError(f"unknown timing profile {name!r} (known: {', '.join(TIMING_PROFILES)})")
    return name


def timing_params(rung: str, profile: str = SHIPPED) -> dict[str, Any]:
    """checklists/<rung>.yaml's `params.timing` with `profile` over it."""
    return {**checklist(rung).param("timing"), **TIMING_PROFILES[check_profile(profile)]}


def protocol(rung: str, profile: str = SHIPPED) -> TimingProtocol:
    """The timing protocol `rung` decides with under `profile` (a rung passes its `ctx.timing_profile`)."""
    return TimingProtocol.from_dict(timing_params(rung, profile))


def timing_record(rung_checklist, profile: str = SHIPPED) -> dict[str, Any]:
    """What an attempt's details say of the timing protocol its rung decided with: the profile's
    name and the protocol it ran (the checklist's `params.timing` with the profile over it); {} for
    a rung whose checklist times nothing. The engine adds it to every attempt it records."""
    shipped = rung_checklist.params.get("timing")
    if shipped is None:
        return {}
    return {"timing_profile": profile, "timing_protocol": {**shipped, **TIMING_PROFILES[check_profile(profile)]}}
