"""Reading a Hugging Face config.json: the one reader for every caller, errors as ConfigError."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from titan_core.config.loader import ConfigError

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays read: real configs nest a few levels (rope
parameters, a quantization or sub-model config); the json module recurses per level, so a
deeper document would end in a RecursionError instead of a message."""

# a JSON string (escapes included) or one bracket: strings are skipped whole, so a bracket
# inside one is not counted
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of the JSON `text`, without recursion; scanning stops once it
    passes `limit` (then limit + 1 is returned). Malformed text gets a count too: the
    parser reports what is wrong with it."""
    depth = deepest = 0
    for m in _TOKEN.finditer(text):
        ch = m.group()
        if ch == "[" or ch == "{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif ch == "]" or ch == "}":
            depth -= 1
    return deepest


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


DIFFUSERS_MODEL_TYPES = {"FluxTransformer2DModel": "flux"}
"""A diffusers model config names its class (`_class_name`), not a model_type: the model_type it is read as."""


MODEL_TYPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a model_type may be: every architecture transformers and diffusers name fits it."""


def read_hf_config_text(path: str | Path, *, require_model_type: bool = False) -> tuple[dict, str]:
    """(config dict, exact file text) from a config.json, or from a folder holding one.

    ConfigError for a missing file, one that is not a regular file or is larger than
    MAX_CONFIG_BYTES (`read_config_file`), malformed JSON, nesting deeper than MAX_DEPTH or a
    value that is not a JSON object;
    with `require_model_type`, also when it names no architecture in `model_type`, or one that is
    not a plain name (MODEL_TYPE_NAME). A diffusers
    config of a class in DIFFUSERS_MODEL_TYPES gets that model_type (the text is left as it is).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    text = read_config_file(path, what="HF config")
    if json_depth(text) > MAX_DEPTH:
        raise ConfigError(
            f"{path}: nesting depth > {MAX_DEPTH}: an HF config.json nests objects and arrays a few levels deep; "
            f"at most {MAX_DEPTH} are read"
        )
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"malformed JSON in {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} is not a JSON object; an HF config.json is one, naming its model_type")
    if "model_type" not in cfg and cfg.get("_class_name") in DIFFUSERS_MODEL_TYPES:
        cfg["model_type"] = DIFFUSERS_MODEL_TYPES[cfg["_class_name"]]
    if require_model_type and (not isinstance(cfg.get("model_type"), str) or not cfg["model_type"]):
        raise ConfigError(
            f"{path} has no model_type; an HF config.json names its architecture there (a diffusers config "
            f"its _class_name, one of {', '.join(DIFFUSERS_MODEL_TYPES)})"
        )
    if require_model_type and not MODEL_TYPE_NAME.fullmatch(cfg["model_type"]):
        # it is written into generated Python and TOML files: a quote or a newline in it would be code there
        raise ConfigError(
            f"{path}: model_type = {json.dumps(cfg['model_type'])} is not accepted; an architecture name is "
            "letters, digits, '_', '-' and '.' (as transformers and diffusers spell theirs), at most 64 characters"
        )
    return cfg, text


def read_hf_config(path: str | Path, *, require_model_type: bool = False) -> dict:
    """The config.json (or a folder's config.json) as a dict; see `read_hf_config_text`."""
    return read_hf_config_text(path, require_model_type=require_model_type)[0]
