"""`onboard compat`: which transformers architectures run on the transformers path, rung by rung.

Per `model_type` a probe (climb.py): a tiny config built with transformers' own config class
(tiny.py: 2 layers, hidden 64, vocab 256; experts and windows shrunk where the class has
them), a workspace scaffolded as `new-model --path transformers` does in a temporary folder,
then the ladder engine itself (`onboard.engine.next_step.next_step`, the rungs of
`default_specs()`) step after step until the ladder is complete or a rung stops it. Every cell
is read back from the workspace's ledger: pass, fail (the first failed criterion or the error
the attempt hit), not applicable (the rung's reason) or not reached. The rungs run as shipped,
judged by their shipped checklists; only their timing decisions are shortened (the
`quick` timing profile, QUICK_TIMING, which every attempt's details name).

Each probe runs in its own process with a time limit (sweep.py), so one architecture's crash,
hang or memory blow-up fails the rung it was on, with a one-line reason. A config the probe
cannot build small (a composite multimodal config, a class that refuses the sizes) is "not
probed", with why. The table files (table.py) are rewritten atomically after every
architecture: a Ctrl-C keeps every row that finished, and `--resume` goes on from them.
"""

from onboard.compat.climb import QUICK_TIMING, cells_of, climb, failure_reason, probe, rungs, scaffold
from onboard.compat.sweep import TIMEOUT_S, load_previous, run_isolated, sweep, sweep_to_files, table
from onboard.compat.table import render_markdown, render_text, write_tables
from onboard.compat.tiny import SIZES, NotProbed, causal_lm_types, check_types, one_line, tiny_config

__all__ = [
    "QUICK_TIMING",
    "SIZES",
    "TIMEOUT_S",
    "NotProbed",
    "causal_lm_types",
    "cells_of",
    "check_types",
    "climb",
    "failure_reason",
    "load_previous",
    "one_line",
    "probe",
    "render_markdown",
    "render_text",
    "run_isolated",
    "rungs",
    "scaffold",
    "sweep",
    "sweep_to_files",
    "table",
    "tiny_config",
    "write_tables",
]
