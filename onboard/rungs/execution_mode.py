"""Which execution mode the recipe trains in, chosen by the timing protocol among those that passed.

Called by the graph_trainer rung, the last execution-mode rung, once its own checks hold.
The candidates are eager, per-block compile (when the compile rung passed) and the Graph
Trainer with the recipe's `[graph_trainer]` settings. Each is built as its own Trainer in
this process and warmed by one step (compile, capture); then each mode's steps are timed
interleaved against eager's (`titan_core.measure.timing.compare`, the checklist's `params.timing`).
A mode is chosen only when it is `faster` than eager; when both are, the Graph Trainer must
also be `faster` than per-block compile head to head. Otherwise the simpler mode stays
(eager < compile < graph_trainer). On a re-run the recipe's mode (an earlier attempt's proven
choice) stands unless this attempt finds the new choice faster than it (`_current_stands`). The choice comes back as recipe edits, which the engine
writes only when the gate passed.
"""

from __future__ import annotations

from onboard.rungs import harness
from onboard.rungs.contract import RecipeEdit, RungContext
from titan_core.measure.timing import TimingProtocol, compare

MODES = ("eager", "compile", "graph_trainer")
"""Simplest first: a tie keeps the earlier one."""


def recipe_mode(cfg) -> str:
    """The execution mode a config trains in."""
    if cfg.graph_trainer.enable:
        return "graph_trainer"
    return "compile" if cfg.compile.enable else "eager"


def _trainer(base, out, mode: str, moe: str | None):
    sections = {
        "eager": {},
        "compile": {"compile": {"enable": True}},
        "graph_trainer": {"graph_trainer": {"enable": True}},
    }
    # enough scheduled steps that the protocol's rounds never run past the lr schedule
    cfg = harness.mode_config(base, out / f"mode-{mode}", steps=10_000, moe=None if mode == "eager" else moe,
                              **sections[mode])  # fmt: skip
    trainer = harness.build_trainer(cfg)
    trainer.train_step()  # compile / capture outside the timed rounds
    return trainer


def _current_stands(
    current: str, choice: str, modes: list[str], vs_eager: dict, head_to_head, faster: list[str]
) -> bool:
    """Whether the recipe's `current` mode (an earlier attempt's proven choice, on a re-run) is
    kept over this attempt's `choice`: it is, unless the protocol found `choice` faster than
    it, so re-verification never flips the mode on noise (the rule of `harness.settle`)."""
    if current == choice or current not in modes or current == "eager":
        return False  # from eager, `choice` was found faster than it
    if choice == "eager":
        return vs_eager[current].outcome != "slower"  # eager wins back only from a slower mode
    if head_to_head is not None:  # both beat eager; was the choice faster than the current head to head?
        a = faster[1]
        return not (head_to_head.outcome == ("faster" if choice == a else "slower"))
    return vs_eager[current].outcome == "faster"  # both beat eager but untimed head to head: keep it


def choose(ctx: RungContext, base, *, rung: str, moe: str | None, modes: list[str]) -> tuple[list[RecipeEdit], dict]:
    """(recipe edits, record) for the fastest of `modes` (eager always among them) by the protocol."""
    proto = TimingProtocol.from_dict(harness.param(rung, "timing"))
    current = recipe_mode(harness.recipe(ctx))
    ctx.log(
        f"{rung}: choosing the execution mode among {', '.join(modes)} (interleaved steps, {proto.confidence:.0%} interval)"
    )
    trainers = {}
    try:
        with harness.process_threads(), harness.quiet_mesh_pickling():
            for mode in modes:
                trainers[mode] = _trainer(base, ctx.attempt_dir, mode, moe)
            sample = {m: (lambda t=t: t.train_step()["step_time_s"]) for m, t in trainers.items()}
            vs_eager = {m: compare(sample[m], sample["eager"], proto) for m in modes if m != "eager"}
            for m, c in vs_eager.items():
                ctx.log(f"{rung}: {c.describe(m, 'eager')}")
            faster = [m for m in modes if m in vs_eager and vs_eager[m].outcome == "faster"]
            choice = faster[0] if faster else "eager"
            head_to_head = None
            if len(faster) == 2:
                head_to_head = compare(sample[faster[1]], sample[faster[0]], proto)
                ctx.log(f"{rung}: {head_to_head.describe(faster[1], faster[0])}")
                choice = faster[1] if head_to_head.outcome == "faster" else faster[0]
    finally:
        for t in trainers.values():
            t.close()
    why = (f"{rung} rung: {vs_eager[choice].describe(choice, 'eager')}" if choice != "eager"
           else "no execution mode was faster than eager by the timing protocol: eager, the simplest")  # fmt: skip
    if head_to_head is not None:
        why += f"; head to head {head_to_head.describe(faster[1], faster[0])}"
    if _current_stands(current, choice, modes, vs_eager, head_to_head, faster):
        why = f"{rung} rung: {current}, the recipe's mode, stands: not beaten by the timing protocol ({why})"
        choice = current
    wanted = {"compile.enable": choice == "compile", "graph_trainer.enable": choice == "graph_trainer"}
    recipe = harness.recipe(ctx)
    have = {"compile.enable": recipe.compile.enable, "graph_trainer.enable": recipe.graph_trainer.enable}
    edits = [RecipeEdit(k, v, why) for k, v in wanted.items() if have[k] != v]
    if choice != "eager" and moe and recipe.kernels.moe != moe:
        edits.append(
            RecipeEdit("kernels.moe", moe, f"{rung} rung: the {choice} mode runs these experts ({harness.DENSE_WHY})")
        )
    record = {
        "execution_mode": choice,
        "execution_mode_was": current,
        "execution_mode_why": why,
        "execution_mode_candidates": list(modes),
        "execution_mode_vs_eager": {m: c.to_dict() for m, c in vs_eager.items()},
        "execution_mode_head_to_head": head_to_head.to_dict() if head_to_head else None,
    }
    return edits, record
