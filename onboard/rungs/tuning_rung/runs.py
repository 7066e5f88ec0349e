"""The tuning rung's candidate recipes, each a Trainer built once and stepped in this process.

Not a rung (no RUNG). `Runs` keeps one Trainer per candidate recipe (a label), records its
step 1 (the numerics a change is classified on) and the peak memory of its step 2 (step 1 pays
for compile or capture), and hands out per-token timing samples for `titan_core.measure.timing.compare`.
Only the recipes still in play stay alive (`keep_only`), so a peak measured is theirs and not
every earlier try's. Each sample runs with its recipe's own thread count: torch's is process-wide
and a Trainer sets it once, when it is built.

The one-rank process group every Trainer joins is made here, before the first of them, and
destroyed in `close`: a Trainer that made it would destroy it when it is dropped, under the others.
"""

from __future__ import annotations

import copy
import gc
from typing import Any, Callable

from onboard.rungs import train_run
from onboard.ladder.contract import RungContext
from titan_core.measure.timing import compare
from onboard.rungs.tuning_rung.classify import Step1
from titan_core.runtime import devices, distributed

SCHEDULED_STEPS = 10_000
"""Steps a candidate's schedule is built for: the timed rounds never run past its lr schedule."""


def tokens_per_step(cfg) -> int:
    t = cfg.training
    return t.batch_size * t.grad_accum * t.seq_len


class Runs:
    def __init__(self, ctx: RungContext, base):
        self.ctx = ctx
        self.device = devices.resolve_device(base.device.type, libtpu_init_flags=base.tpu.libtpu_init_flags)
        self.dist = None
        if base.parallelism.data_parallel != "none":
            self.dist = distributed.init_distributed(self.device, base.parallelism.timeout_s)
        self.cfgs: dict[str, Any] = {}
        self.trainers: dict[str, Any] = {}
        self.step1: dict[str, Any] = {}
        self.peak: dict[str, int] = {}
        self.step2_s: dict[str, float] = {}
        self.curves: dict[str, list[float]] = {}

    # ---- one candidate --------------------------------------------------------------------
    def probe(self, label: str, cfg) -> dict:
        """Build `cfg` as candidate `label` and run its steps 1 and 2: {step1, peak_bytes, step_time_s}.

        Once per label: a label probed before answers from what it measured then (its Trainer may
        have been dropped since; only the labels still in play can be timed)."""
        if label not in self.step1:
            cfg = copy.deepcopy(cfg)
            cfg.training.steps = SCHEDULED_STEPS
            cfg.metrics.output_dir = str(self.ctx.attempt_dir / "tries" / label)
            self.cfgs[label] = cfg
            try:
                with train_run.process_threads(cfg.device.threads), train_run.quiet_mesh_pickling():
                    trainer = train_run.build_trainer(cfg)
                    self.trainers[label] = trainer
                    row1 = trainer.train_step()
                    devices.reset_peak_memory(self.device)
                    row2 = trainer.train_step()
            except BaseException:
                self.drop(label)  # a half-built candidate must not hold memory for the next one
                raise
            self.step1[label] = Step1.from_row(row1)
            self.peak[label] = int(row2["peak_mem_bytes"])
            self.step2_s[label] = row2["step_time_s"]
        return {"step1": self.step1[label], "peak_bytes": self.peak[label], "step_time_s": self.step2_s[label]}

    def sampler(self, label: str) -> Callable[[], float]:
        """One timing sample of `label`: a training step's seconds per token."""
        if label not in self.trainers:
            raise KeyError(f"{label} was dropped: only the recipes still in play can be timed")
        trainer, cfg = self.trainers[label], self.cfgs[label]
        tokens = tokens_per_step(cfg)

        def sample() -> float:
            with train_run.process_threads(cfg.device.threads), train_run.quiet_mesh_pickling():
                return trainer.train_step()["step_time_s"] / tokens

        return sample

    def compare(self, candidate: str, holder: str, protocol):
        """The timing protocol's answer for `candidate` against `holder`, per token."""
        return compare(self.sampler(candidate), self.sampler(holder), protocol)

    def curve(self, label: str, cfg, steps: int) -> list[float]:
        """The loss curve of `cfg` over `steps` from a fresh start (its own Trainer, then dropped)."""
        if label not in self.curves:
            cfg = copy.deepcopy(cfg)
            cfg.training.steps = steps
            cfg.metrics.output_dir = str(self.ctx.attempt_dir / "curves" / label)
            with train_run.process_threads(cfg.device.threads):
                _, result = train_run.train(self.ctx, cfg, f"tuning: curve of {label}")
            self.curves[label] = [r["loss"] for r in result.metrics]
        return self.curves[label]

    def drop(self, label: str) -> None:
        trainer = self.trainers.pop(label, None)
        if trainer is not None:
            trainer.close()
        gc.collect()

    def keep_only(self, *labels: str) -> None:
        """Drop every Trainer but `labels` (their memory goes back before the next one is built)."""
        for label in [k for k in self.trainers if k not in labels]:
            self.trainers.pop(label).close()
        gc.collect()

    def current_memory(self) -> int:
        """What this process holds now (the peak counter restarted at the present use)."""
        devices.reset_peak_memory(self.device)
        return devices.peak_memory_bytes(self.device)

    def close(self) -> None:
        self.keep_only()
        distributed.teardown(self.dist)
