"""Rungs that run: one module per ladder rung (`eager_rung.py`, `parity_rung.py`, ...; the suffix keeps
each name apart from the titan_core package it drives, e.g. titan_core/kernels) with its `run(ctx)`
and the helpers only it uses, and what several rungs share, one job per module: the recipe a gate
runs and its numbers (gate_recipe), another execution mode's recipe (mode_recipe), running a
training process (train_run), timing it (timing_profiles), comparing runs (run_compare), the
execution-mode levers, the full-model probe, the kernel comparisons (kernel_compare, kernel_modes)
and the tuning rung's parts (tuning_*: the flag tables, the batch search, the profile breakdown).

What a rung is (its measurements, the recipe keys it reads and earns, its not-applicable rule) is
declared in the rung table, onboard/ladder/table.py; only the engine's next-step imports a module
here (`RungSpec.load_module`), so these import torch freely.
"""
