"""One module per ladder rung (`eager.py`, `parity.py`, ...); the contract is in base.py.

The engine (onboard/engine/ladder.py) finds a rung by importing `onboard.rungs.<rung>`; a rung
of DESIGN section 1 without a module here is "not built yet".
"""
