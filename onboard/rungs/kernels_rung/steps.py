"""Whole training steps of the gate's recipe with one kernels field changed, timed interleaved:
what the kernels rung's keep decisions are timed on. Not a rung (no RUNG).

A kernel's speed is the speed of the step the recipe will run: forward, backward, gradient
clipping and the optimizer, in the recipe's execution mode (per-block compile, the Graph
Trainer) and precision, at its batch. A bare model's forward + backward leaves out what a
kernel changes around it (a captured program, the optimizer's share, the precision's casts),
and was seen to call a kernel 1.35x faster that whole steps found 1.4-2.5x slower.

`WholeSteps.compare(field, candidate, against)` builds one titan_core Trainer per side (the
gate's recipe with kernels.<field> at that value), warms each by one step outside the timed
rounds (compile, capture), then times their `train_step`s interleaved
(titan_core.measure.timing.compare, the rung's protocol). It keeps at most the two trainers the
current comparison needs: a field's holder, shared by every candidate timed against it, stays
built while the candidates come and go; `close` releases the rest.
"""

from __future__ import annotations

import copy
from typing import Any

from onboard.rungs import gate_recipe, train_run
from onboard.ladder.contract import RungContext
from titan_core.config.loader import set_key
from titan_core.config.execution_modes import execution_mode, set_execution_mode
from titan_core.measure.timing import TimingProtocol, compare

SCHEDULED_STEPS = 10_000
"""The steps each trainer's lr schedule is built for: more than the protocol's rounds ever run, so the
timed steps never run past the schedule's end."""


class StepsRaised(RuntimeError):
    """A side's trainer failed to build, warm or step."""

    def __init__(self, side: str, value: str, error: BaseException):
        super().__init__(f"the whole step with {value} ({side}) raised {type(error).__name__}: {error}")
        self.side = side
        """"candidate" or "holder" (the value the candidate was timed against)."""
        self.value = value
        """The kernels field's value on that side."""


class WholeSteps:
    """Trainers of the gate's recipe, in its own execution mode and precision, one per kernels value."""

    def __init__(self, ctx: RungContext, proto: TimingProtocol):
        self.ctx = ctx
        self.proto = proto
        base = gate_recipe.job_config(ctx)
        self.mode = execution_mode(gate_recipe.recipe(ctx))
        # job_config runs eager; a kernel is timed in the mode the recipe trains in
        set_execution_mode(base, self.mode)
        base.training.steps = SCHEDULED_STEPS
        self.base = base
        self.trainers: dict[tuple[str, str], Any] = {}
        self.built = 0
        """Trainers built so far (each builds the model once)."""

    def _trainer(self, field_name: str, value: str):
        key = (field_name, value)
        if key not in self.trainers:
            cfg = copy.deepcopy(self.base)
            set_key(cfg, f"kernels.{field_name}", value)
            cfg.metrics.output_dir = str(self.ctx.attempt_dir / "whole-steps" / f"{field_name}-{value}")
            trainer = train_run.build_trainer(cfg)
            self.built += 1
            try:
                trainer.train_step()  # compile / capture outside the timed rounds
            except BaseException:
                trainer.close()
                raise
            self.trainers[key] = trainer
        return self.trainers[key]

    def compare(self, field_name: str, candidate: str, against: str) -> dict:
        """Comparison.to_dict() of kernels.<field>=`candidate`'s whole steps against `against`'s, with
        "describe" (one line). Raises StepsRaised naming the side whose trainer failed."""
        needed = {(field_name, candidate), (field_name, against)}
        for key in [k for k in self.trainers if k not in needed]:
            self.trainers.pop(key).close()
        sides = {}
        for side, value in (("holder", against), ("candidate", candidate)):
            try:
                with train_run.quiet_mesh_pickling():
                    sides[side] = self._trainer(field_name, value)
            except Exception as e:  # noqa: BLE001 -- the caller records which side could not run the recipe's step
                raise StepsRaised(side, value, e) from e

        def sample(side: str, value: str):
            trainer = sides[side]

            def run() -> float:
                try:
                    return trainer.train_step()["step_time_s"]
                except Exception as e:  # noqa: BLE001 -- as above, named by side
                    raise StepsRaised(side, value, e) from e

            return run

        with train_run.quiet_mesh_pickling():
            cmp = compare(sample("candidate", candidate), sample("holder", against), self.proto)
        a, b = f"{field_name}={candidate}", f"{field_name}={against}"
        return {**cmp.to_dict(), "describe": cmp.describe(a, b)}

    def close(self) -> None:
        """Release every trainer still built."""
        while self.trainers:
            self.trainers.popitem()[1].close()

    def __enter__(self) -> "WholeSteps":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
