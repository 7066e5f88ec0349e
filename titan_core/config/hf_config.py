"""Reading a Hugging Face config.json: the one reader for every caller, errors as ConfigError."""

from __future__ import annotations

import json
import re
from pathlib import Path

from titan_core.config.files import MAX_CONFIG_BYTES, read_config_file  # noqa: F401 -- the readers' home
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


DIFFUSERS_MODEL_TYPES = {"FluxTransformer2DModel": "flux"}
"""A diffusers model config names its class (`_class_name`), not a model_type: the model_type it is read as."""


def config_upstream(cfg: dict) -> str:
    """The library whose class the config.json `cfg` describes: "diffusers" for a class of
    DIFFUSERS_MODEL_TYPES, else "transformers". Read without loading a model: it is the
    `ModelKind.upstream` of the family that runs the config (tests/core/unit/test_model_protocol.py)."""
    return "diffusers" if cfg.get("_class_name") in DIFFUSERS_MODEL_TYPES else "transformers"


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
