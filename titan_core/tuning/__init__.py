"""Tuning primitives: the declared flag tables, the batch search, and a profile's step-time breakdown. Each decides nothing on its own: a caller
passes measurements in and reads the answer out.

    flags.py              compiler/runtime flags per device kind, and how one is applied to a JobConfig
    batch_search.py       raise the per-device batch until memory binds or throughput stops improving
    profile_breakdown.py  a few steps under torch.profiler: time per category, top ops, trace file
"""
