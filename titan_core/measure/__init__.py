"""How results are measured and compared: per-step metrics and their reader, the steady window of a run
(run_stats), the one relative error (numerics), the one timing protocol (timing) and profiler windows."""
