"""The process a run lives in: the device kind and its synchronisation (devices), the CPU's matmul peak
(cpu_peak) and the machine's CPU load (cpu_load), the process group (distributed) and a traceable
all-reduce over it (collectives), a command line's argv, and child processes that die with their parent.
The multi-process launcher is titan_core.launcher: it checks a recipe with layers above this one."""
