"""The tuning rung (rung.py: its run(ctx)) and its parts, one job each: the batch search (search.py, batch.py),
activation checkpointing where memory ended the search (recompute.py), the flags of a device kind
(flags.py), each change classified on step 1 (classify.py) and kept by the keep rule (decisions.py), the
runs it makes (runs.py) and the final recipe's profile (profile.py)."""
