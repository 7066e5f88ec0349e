"""One module per ladder rung (`eager_rung.py`, `parity_rung.py`, ...; the suffix keeps each name
apart from the titan_core package it drives, e.g. titan_core/kernels), the contract between the
engine and a rung (contract.py), and what several rungs share: the harness that runs the
workspace's model, the execution-mode levers, the full-model probe, the kernel comparisons
(kernel_compare, kernel_modes) and the tuning rung's numerics class of a change (tuning_classify).

The engine (onboard/engine/ladder.py) finds a rung by importing `onboard.rungs.<rung>_rung`; a
rung of DESIGN section 1 without a module here is "not built yet".
"""
