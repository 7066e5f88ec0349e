"""`onboard compat`: which transformers architectures run on the transformers path, rung by rung.

Per `model_type` a probe (climb.py) climbs the ladder with the engine's own `next_step` on a
workspace scaffolded from a tiny config (tiny.py), judged by the shipped checklists; only the
timing decisions are shortened (the `quick` timing profile, QUICK_TIMING). Each probe runs in a
process of its own with a time limit (sweep.py), so one architecture's crash, hang or memory blow-up
fails the rung it was on; a config the probe cannot build small is "not probed", with why. The
table files (table.py) are rewritten atomically after every architecture, so a Ctrl-C keeps every
row that finished and `--resume` goes on from them.
"""

# ruff: noqa: F401  (the package re-exports its modules' public names)

from onboard.compat.climb import QUICK_TIMING, cells_of, climb, failure_reason, probe, rungs, scaffold
from onboard.compat.sweep import TIMEOUT_S, load_previous, run_isolated, sweep, sweep_to_files, table
from onboard.compat.table import render_markdown, render_text, write_tables
from onboard.compat.tiny import SIZES, NotProbed, causal_lm_types, check_types, one_line, tiny_config
