"""Reading a config file a person names (a recipe, a config.json): the one reader that names a FIFO or a
device for what it is and refuses a file too big to be a config before reading it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from titan_core.config.config_error import ConfigError

MAX_CONFIG_BYTES = 16 * 10**6
"""Largest config file read: an HF config.json is a few kilobytes (one holding a tokenizer's or a
sub-model's settings some hundreds); a bigger file is not a config, and is refused before it is read."""

_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
)  # fmt: skip


def _kind(mode: int) -> str | None:
    """What a file that is not a regular one is, in words; None for a regular file."""
    return None if stat.S_ISREG(mode) else next((w for test, w in _NOT_REGULAR if test(mode)), "not a plain file")


def read_config_file(path: str | Path, *, what: str = "config", limit: int = MAX_CONFIG_BYTES) -> str:
    """The text of a config file a person named (UTF-8, undecodable bytes replaced), or ConfigError:
    missing ("not found"), not a regular file (a FIFO, a device, a socket: named as such, never
    opened to wait on a writer or read without end) or larger than `limit` bytes (refused from its
    size; a file whose size the system does not say is read to `limit` + 1 bytes at most)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise ConfigError(f"{what} {path} is {kind}, not a regular file")
    # O_NONBLOCK: a FIFO swapped in after the stat does not block the open; the fstat below refuses it
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        kind = _kind(st.st_mode)
        if kind is not None:
            raise ConfigError(f"{what} {path} is {kind}, not a regular file")
        if st.st_size > limit:
            raise ConfigError(_too_big(what, path, f"{st.st_size:,} bytes", limit))
        data = f.read(limit + 1)  # a /proc-like file reports size 0 and may be longer
    if len(data) > limit:
        raise ConfigError(_too_big(what, path, f"over {limit:,} bytes", limit))
    return data.decode("utf-8", errors="replace")


def _too_big(what: str, path: Path, size: str, limit: int) -> str:
    return (
        f"{what} {path} is {size}: a config file is kilobytes, at most {limit // 10**6} MB "
        f"(MAX_CONFIG_BYTES) is read; is it the right file?"
    )
