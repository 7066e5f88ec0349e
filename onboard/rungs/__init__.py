"""Rungs that run: one module per rung (`<rung>_rung.py`, or a package `<rung>_rung/` with `rung.py` beside its parts, for the
kernels and tuning rungs: its `run(ctx)` and the helpers only it uses) and
what several rungs share, one job per module (docs/LAYOUT.md). What a rung is lives in the rung table
(onboard/ladder/table.py); only the engine's next-step imports a rung's `run(ctx)` module (by the name the table declares:
onboard/engine/next_step.py, `runner_of`); reading commands import nothing here, so these import torch freely.
"""
