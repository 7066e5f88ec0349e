"""Which execution mode the recipe trains in: the recipe's own mode (the holder) stands unless
another mode that passed is faster than it by the timing protocol (`decision.decide`).

Called by the graph_trainer rung, the last execution-mode rung, once its own checks hold. Each
mode (eager, per-block compile when the compile rung passed, the Graph Trainer with the recipe's
`[graph_trainer]` settings) is built as its own Trainer in this process, warmed by one step, and
timed interleaved against the holder (eager when the recipe's mode is not among those that passed);
when two beat it, the later one (eager < compile < graph_trainer) is taken only when `faster` than
the earlier. The lever's one Decision (`execution_mode`) comes back beside the recipe edits.
"""

from __future__ import annotations

import copy
import dataclasses

from onboard.ladder import decision
from onboard.rungs import gate_recipe, mode_recipe, timing_profiles, train_run
from onboard.ladder.contract import RecipeEdit, RungContext
from onboard.ladder.gates import comparison_line
from titan_core.config.loader import ConfigError
from titan_core.config.execution_modes import MODE_KEYS, MODES, execution_mode, mode_switches, set_execution_mode
from titan_core.measure.timing import compare
from titan_core.parallel import check_parallelism
from titan_core.parallel.mesh import smallest_world

LEVER = "execution_mode"


def mode_set_by(ledger, mode: str) -> str | None:
    """The rung that put `mode` in the recipe (its recorded edit of the mode's key), or None."""
    if mode in MODE_KEYS:
        return decision.holder_set_by(ledger, MODE_KEYS[mode])
    for key in reversed(MODE_KEYS.values()):  # eager: the rung that last switched a mode off, the later mode's first
        if by := decision.holder_set_by(ledger, key):
            return by
    return None


def accepted_modes(recipe, modes: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the modes titan_core runs at the recipe's parallel degrees, {mode: its refusal} of the others).

    The rungs prove each mode at degree 1 (gate_recipe); the recipe the user takes away runs at
    its own ep/cp/pp, where titan_core refuses some modes (cp or ep with the Graph Trainer, pp
    with compile): such a mode is never chosen, so the recipe earned is one titan_core runs. A
    refusal of the degrees in eager too is not the mode's: the simple_fsdp rung reports that."""
    def refusal(mode: str) -> str | None:
        cfg = copy.deepcopy(recipe)
        set_execution_mode(cfg, mode)
        try:
            check_parallelism(cfg, smallest_world(cfg.parallelism))
        except ConfigError as e:
            return " ".join(str(e).split())
        return None

    if refusal("eager") is not None:
        return list(modes), {}
    refused = {m: why for m in modes if m != "eager" and (why := refusal(m)) is not None}
    return [m for m in modes if m not in refused], refused


def _trainer(base, out, mode: str, moe: str | None):
    # enough scheduled steps that the protocol's rounds never run past the lr schedule
    cfg = mode_recipe.mode_config(base, out / f"mode-{mode}", mode=mode, steps=10_000,
                                  moe=None if mode == "eager" else moe)  # fmt: skip
    trainer = train_run.build_trainer(cfg)
    trainer.train_step()  # compile / capture outside the timed rounds
    return trainer


def _faster(cmp) -> bool:
    # a non-finite interval is not measured, whatever its outcome says (decision.outcome_of)
    return decision.outcome_of(cmp.to_dict()) == "faster"


def mode_decision(rung: str, holder: str, vs_holder: dict, head_to_head, *, set_by: str | None) -> decision.Decision:
    """The lever's Decision from the comparisons of each other mode against the holder (`vs_holder`,
    mode -> Comparison) and, when two beat it, of the later against the earlier (`head_to_head`)."""
    beat = [m for m in MODES if m in vs_holder and _faster(vs_holder[m])]
    if len(beat) == 2 and head_to_head is not None:
        winner = beat[1] if _faster(head_to_head) else beat[0]
    elif beat:
        winner = beat[0]
    else:  # the holder stands: the record is of the closest challenger (the largest estimate)
        def estimate(m):
            speedup, _ = decision.speed_figure(vs_holder[m].to_dict())
            return speedup if speedup is not None else 0.0

        winner = max((m for m in MODES if m in vs_holder), key=estimate)
    d = decision.decide(rung, LEVER, holder=holder, candidate=winner, comparison=vs_holder[winner].to_dict(),
                        set_by=set_by)  # fmt: skip
    notes = [comparison_line(vs_holder[m], m, holder) for m in vs_holder if m != winner]
    if head_to_head is not None and len(beat) == 2:
        notes.append(f"head to head {comparison_line(head_to_head, beat[1], beat[0])}: {winner}, "
                     + ("faster" if winner == beat[1] else "the simpler, as the later was not faster"))  # fmt: skip
    return dataclasses.replace(d, why=d.why + "".join(f"; {n}" for n in notes))


def choose(ctx: RungContext, base, *, rung: str, moe: str | None, modes: list[str]) -> tuple[list[RecipeEdit], dict]:
    """(recipe edits, record) of the execution mode among `modes` (eager always among them): the
    recipe's mode unless another is faster than it by the protocol. The record's `decisions` is
    the lever's Decision (to_dict), for the rung's details."""
    proto = timing_profiles.protocol(rung, ctx.timing_profile)
    recipe = gate_recipe.recipe(ctx)
    modes, refused = accepted_modes(recipe, modes)
    for m, why in refused.items():
        ctx.log(f"{rung}: {m} is not a candidate for the recipe: titan_core refuses it at its parallel degrees ({why})")
    current = execution_mode(recipe)
    holder = current if current in modes else "eager"
    others = [m for m in modes if m != holder]
    if not others:  # every other mode refused at the recipe's degrees: nothing to time
        return _only_mode(rung, recipe, holder, current, refused)
    ctx.log(f"{rung}: the recipe's mode {holder} against {', '.join(others)} (interleaved steps, "
            f"{proto.confidence:.0%} interval; {proto.describe_budget()}); it stands unless one is faster")  # fmt: skip
    trainers = {}
    try:
        with train_run.process_threads(), train_run.quiet_mesh_pickling():
            for mode in modes:
                trainers[mode] = _trainer(base, ctx.attempt_dir, mode, moe)
            sample = {m: (lambda t=t: t.train_step()["step_time_s"]) for m, t in trainers.items()}
            vs_holder = {m: compare(sample[m], sample[holder], proto) for m in others}
            for m, c in vs_holder.items():
                ctx.log(f"{rung}: {comparison_line(c, m, holder)}")
            beat = [m for m in MODES if m in vs_holder and _faster(vs_holder[m])]
            head_to_head = None
            if len(beat) == 2:
                head_to_head = compare(sample[beat[1]], sample[beat[0]], proto)
                ctx.log(f"{rung}: {comparison_line(head_to_head, beat[1], beat[0])}")
    finally:
        for t in trainers.values():
            t.close()
    d = mode_decision(rung, holder, vs_holder, head_to_head, set_by=mode_set_by(ctx.workspace.ledger, holder))
    if holder != current:
        said = f"the recipe's {current} is not among the modes that passed, so eager held"
        d = dataclasses.replace(d, why=f"{said}; {d.why}")
    choice = d.value
    why = f"{rung} rung: {d.why}"
    edits = _mode_edits(recipe, choice, why)
    if choice != "eager" and moe and recipe.kernels.moe != moe:
        edits.append(
            RecipeEdit("kernels.moe", moe,
                       f"{rung} rung: the {choice} mode runs these experts ({mode_recipe.DENSE_WHY})")
        )
    record = {
        "execution_mode": choice,
        "execution_mode_was": current,
        "execution_mode_holder": holder,
        "execution_mode_why": why,
        "execution_mode_candidates": list(modes),
        "execution_mode_vs_holder": {m: c.to_dict() for m, c in vs_holder.items()},
        "execution_mode_head_to_head": head_to_head.to_dict() if head_to_head else None,
        "execution_mode_refused": refused,
        "decisions": [d.to_dict()],
    }
    return edits, record


def _only_mode(rung: str, recipe, holder: str, current: str, refused: dict[str, str]) -> tuple[list[RecipeEdit], dict]:
    """The record and edits when `holder` is the only mode titan_core runs at the recipe's degrees."""
    why = f"{rung} rung: {holder} is the only mode titan_core runs at the recipe's parallel degrees (" + "; ".join(
        f"{m}: {r}" for m, r in refused.items()) + ")"  # fmt: skip
    d = decision.Decision(rung=rung, lever=LEVER, holder=current, candidate=holder, value=holder,
                          verdict=decision.KEPT if holder != current else decision.HELD, figure="none", why=why)  # fmt: skip
    edits = _mode_edits(recipe, holder, why)
    record = {"execution_mode": holder, "execution_mode_was": current, "execution_mode_holder": holder,
              "execution_mode_why": why, "execution_mode_candidates": [holder], "execution_mode_vs_holder": {},
              "execution_mode_head_to_head": None, "execution_mode_refused": refused, "decisions": [d.to_dict()]}  # fmt: skip
    return edits, record


def _mode_edits(recipe, mode: str, why: str) -> list[RecipeEdit]:
    """The recipe edits that switch `recipe` from its own mode to `mode` (none when it is already there)."""
    have = mode_switches(execution_mode(recipe))
    return [RecipeEdit(k, v, why) for k, v in mode_switches(mode).items() if have[k] != v]
