"""A config file a person names is read only when it is a regular file of a config's size: a FIFO or
a device is named as what it is (never opened to wait on a writer or read without end), a file over
MAX_CONFIG_BYTES is refused from its size without being read, and a file that hides its size (procfs)
is read to the cap and no further. read_hf_config_text, which every HF config.json goes through, holds it."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from titan_core.config.hf_config import MAX_CONFIG_BYTES, read_config_file, read_hf_config_text
from titan_core.config.loader import ConfigError


def test_the_cap_is_16_mb():
    assert MAX_CONFIG_BYTES == 16 * 10**6


def test_a_fifo_is_named_and_never_waited_on(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # no writer: a blocking open or read would hang the test here
    with pytest.raises(ConfigError, match=r"config\.json is a FIFO, not a regular file"):
        read_hf_config_text(fifo)
    with pytest.raises(ConfigError, match=r"is a FIFO, not a regular file"):
        read_hf_config_text(tmp_path)  # the folder's config.json is the FIFO


def test_a_device_is_named():
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    with pytest.raises(ConfigError, match=r"HF config /dev/zero is a character device, not a regular file"):
        read_hf_config_text("/dev/zero")


def test_missing_still_reads_not_found(tmp_path):
    with pytest.raises(ConfigError, match=r"HF config not found: .*nothing\.json"):
        read_hf_config_text(tmp_path / "nothing.json")


def test_a_huge_config_is_refused_without_being_read(tmp_path):
    big = tmp_path / "config.json"
    with open(big, "wb") as f:
        f.truncate(200 * 10**6)  # sparse: 200 MB by its size, no disk spent
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"is 200,000,000 bytes: .* at most 16 MB \(MAX_CONFIG_BYTES\)"):
            read_hf_config_text(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10**6  # nothing of it was read


def test_a_file_that_hides_its_size_is_read_to_the_cap_only():
    status = Path("/proc/self/status")  # st_size 0, content about a kilobyte
    if not status.exists():
        pytest.skip("no procfs here")
    assert os.stat(status).st_size == 0
    with pytest.raises(ConfigError, match=r"over 100 bytes"):
        read_config_file(status, limit=100)
    assert "Name:" in read_config_file(status)


def test_a_config_at_the_cap_is_read(tmp_path):
    path = tmp_path / "config.json"
    text = json.dumps({"model_type": "llama", "pad": "x" * 100})
    path.write_text(text)
    assert read_hf_config_text(path) == (json.loads(text), text)
    with pytest.raises(ConfigError, match=r"over|bytes"):
        read_config_file(path, limit=len(text) - 1)
    assert read_config_file(path, limit=len(text)) == text


def test_a_recipe_is_read_through_the_same_reader(tmp_path):
    """titan_core.train --config names a FIFO for what it is, and refuses a huge file unread."""
    import os

    import pytest

    from titan_core.config import ConfigError, load_config

    fifo = tmp_path / "recipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a FIFO, not a regular file"):
        load_config(fifo)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
