"""The kernels rung (rung.py: its run(ctx)) and its parts: each kernel against its plain path
(compare.py), in the recipe's execution mode (modes.py), float8 against its own bound (float8_check.py),
whole steps timed (steps.py) and the keep rule over them (decide.py)."""
