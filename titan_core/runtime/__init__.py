"""The process a run lives in: the device kind and its synchronisation (devices), the CPU's matmul peak
(cpu_peak), the process group (distributed) and a traceable all-reduce over it (collectives), the
multi-process launcher and its argv, and child processes that die with their parent."""
