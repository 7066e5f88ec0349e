"""titan_core: a compact TorchTitan-style trainer for CPU, CUDA and TPU."""

__version__ = "0.1.0"
