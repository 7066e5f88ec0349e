"""Test-wide settings: never auto-load an installed TPU backend, never reach a model hub."""

import os
import tempfile

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the CPU peak kept across runs (titan_core.runtime.cpu_peak) goes to a folder of this test session, not ~/.cache
os.environ.setdefault("TITAN_CORE_CACHE_DIR", tempfile.mkdtemp(prefix="titan-core-cache-"))
