"""A torch.profiler window over a range of steps, written as Chrome traces."""

from __future__ import annotations

from pathlib import Path

import torch

from titan_core.config.sections import Profiler as ProfilerConfig


class StepProfiler:
    """Call `step(n)` after every training step; traces steps [start, start + num_steps)."""

    def __init__(self, cfg: ProfilerConfig, folder: Path, rank: int = 0):
        self.cfg, self.folder, self.rank = cfg, folder, rank
        self._prof: torch.profiler.profile | None = None
        self.trace_path: Path | None = None

    def before_step(self, step: int) -> None:
        if self.cfg.enable and step == self.cfg.start_step and self._prof is None:
            self._prof = torch.profiler.profile(record_shapes=True, with_stack=False)
            self._prof.__enter__()

    def after_step(self, step: int) -> None:
        if self._prof is not None and step >= self.cfg.start_step + self.cfg.num_steps - 1:
            self.close()

    def close(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trace_path = self.folder / f"trace_rank{self.rank}.json"
        prof.export_chrome_trace(str(self.trace_path))
