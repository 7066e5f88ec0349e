"""TOML recipe -> JobConfig, then `--section.key=value` overrides, then the fields' range checks; and back to TOML."""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import functools
import inspect
import math
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args, get_origin

import tomli_w

from titan_core.config.config_error import ConfigError
from titan_core.config.files import read_config_file
from titan_core.config.sections import JobConfig




def did_you_mean(name: str, options: list[str]) -> str:
    """The suffix for an unknown-name error: the closest valid option, or all of them."""
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else f" (valid: {', '.join(options)})"


@functools.cache
def _field_types(cls) -> Mapping[str, Any]:
    """Field name -> type of a config dataclass, read-only. Cached: `get_type_hints` evaluates every
    annotation string anew on each call (most of a `load_config`), and a class's fields never change."""
    hints = typing.get_type_hints(cls)
    return MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls)})


def _coerce(value: Any, tp: Any, where: str, typed: bool = False) -> Any:
    """Convert `value` (from TOML or a command-line string) to the field type `tp`. `typed`: the
    value came from TOML, which has its own booleans and numbers, so a quoted one is refused:
    `enable = "false"` is a non-empty string, which any reader of the raw table takes as true."""
    origin = get_origin(tp)
    if typed and tp in (bool, int, float) and isinstance(value, str):
        kind = "true or false" if tp is bool else "an integer" if tp is int else "a number"
        raise ConfigError(f"{where}: expected {kind}, got the string {value!r} (write it unquoted)")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: '{value}' is not one of {', '.join(map(str, choices))}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true/false, got '{value}'")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got '{value}'")
        if isinstance(value, int):
            return value
        try:
            return int(str(value), 0)
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got '{value}'") from None
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return float(str(value))
        except ValueError:
            raise ConfigError(f"{where}: expected a number, got '{value}'") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is list or origin is list:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return list(value)
    if tp is dict or origin is dict:
        if isinstance(value, str):
            try:
                value = tomllib.loads(f"v = {value}")["v"]
            except tomllib.TOMLDecodeError:
                raise ConfigError(f"{where}: expected an inline table like {{a = 1}}, got '{value}'") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return dict(value)
    raise TypeError(f"unsupported config field type {tp} at {where}")


def _apply_section(section_obj: Any, values: dict, section: str, typed: bool = False) -> None:
    types = _field_types(type(section_obj))
    for key, value in values.items():
        if key not in types:
            raise ConfigError(f"unknown key '{section}.{key}'{did_you_mean(key, list(types))}")
        setattr(section_obj, key, _coerce(value, types[key], f"{section}.{key}", typed))


def from_dict(data: dict) -> JobConfig:
    """A JobConfig from a recipe's tables (TOML-typed values: a quoted boolean or number is refused)."""
    cfg = JobConfig()
    sections = _field_types(JobConfig)
    for section, values in data.items():
        if section not in sections:
            raise ConfigError(f"unknown section '{section}'{did_you_mean(section, list(sections))}")
        if not isinstance(values, dict):
            raise ConfigError(f"section '{section}' must be a table, got {values!r}")
        _apply_section(getattr(cfg, section), values, section, typed=True)
    return cfg


# ---- dotted keys: "section.name" in a config (attributes) or a recipe's tables (dict items) ----
MISSING = object()
"""The `default` of `get_key` that tells a missing key from one that holds None."""
_REQUIRED = object()


def _children(node: Any) -> dict | None:
    """The named parts under `node`: a dict's items, a config dataclass's fields; None for a leaf."""
    if isinstance(node, dict):
        return node
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    return None


def _unknown(key: str, part: str, node: Any) -> ConfigError:
    children = _children(node)
    return ConfigError(f"unknown key '{key}'" + (did_you_mean(part, list(children)) if children else ""))


def get_key(tree: Any, key: str, default: Any = _REQUIRED) -> Any:
    """The value at `key` ("training.steps"; any depth) of a JobConfig or a recipe dict. A missing
    part gives `default`, or, with none given, a ConfigError naming the key."""
    node = tree
    for part in key.split("."):
        children = _children(node)
        if children is None or part not in children:
            if default is _REQUIRED:
                raise _unknown(key, part, node)
            return default
        node = children[part]
    return node


def set_key(tree: Any, key: str, value: Any) -> None:
    """Set `key` in a JobConfig (the field must exist: ConfigError) or a recipe dict (tables made on the way)."""
    *path, name = key.split(".")
    node = tree
    for part in path:
        parent = node
        node = node.setdefault(part, {}) if isinstance(node, dict) else get_key(node, part, MISSING)
        if node is MISSING:
            raise _unknown(key, part, parent)
    if isinstance(node, dict):
        node[name] = value
    elif get_key(node, name, MISSING) is MISSING:  # a dataclass is never given a new attribute
        raise _unknown(key, name, node)
    else:
        setattr(node, name, value)


def with_keys(cfg: Any, values: dict[str, Any]) -> Any:
    """A deep copy of `cfg` with each dotted key of `values` set (values as given, not coerced)."""
    out = copy.deepcopy(cfg)
    for key, value in values.items():
        set_key(out, key, value)
    return out


def load_toml(path: str | Path) -> dict:
    path = Path(path)
    text = read_config_file(path, what="config file")  # a FIFO named, a huge file refused unread
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"malformed TOML in {path}: {e}") from None


def apply_overrides(cfg: JobConfig, overrides: list[str]) -> JobConfig:
    """Apply `--section.key=value` (or `--section.key value`) strings in order."""
    _apply_overrides(cfg, overrides)
    return cfg


def _apply_overrides(cfg: JobConfig, overrides: list[str]) -> set[str]:
    """apply_overrides' work; returns the dotted keys it set."""
    done: set[str] = set()
    sections = _field_types(JobConfig)
    items = list(overrides)
    i = 0
    while i < len(items):
        arg = items[i]
        if not arg.startswith("--"):
            raise ConfigError(f"expected --section.key=value, got '{arg}'")
        body = arg[2:]
        dotted, has_eq, value = body.partition("=")
        if "." not in dotted:
            raise ConfigError(f"override '{arg}' must name a section and a key, like --training.steps=10")
        section, key = dotted.split(".", 1)
        if section not in sections:
            raise ConfigError(f"unknown section '{section}'{did_you_mean(section, list(sections))}")
        if not has_eq:
            if i + 1 < len(items) and not items[i + 1].startswith("--"):
                value = items[i + 1]
                i += 1
            elif _field_types(sections[section]).get(key) is bool:
                value = "true"  # a bare boolean flag switches it on
            else:
                raise ConfigError(f"override '{arg}' has no value (use --{dotted}=VALUE)")
        _apply_section(getattr(cfg, section), {key: value}, section)
        done.add(f"{section}.{key}")
        i += 1
    return done


# Paths a recipe names: its input files, the tokenizer cache and the output folders. Relative
# values are relative to the recipe's own folder, so a recipe works from any current
# directory (a recipe whose metrics.output_dir is `runs/x` writes beside itself); this is the only place
# that anchors them. Command-line overrides stay relative to the current directory, as a
# shell user expects, and so does a field left at its default (for data.cache_dir,
# `.cache/titan_core`): `--print-config` output loaded as a recipe then prints the same.
RECIPE_RELATIVE_PATHS = (
    "model.hf_config",
    "model.module_file",
    "model.adapter_file",
    "data.path",
    "data.cache_dir",
    "metrics.output_dir",
    "checkpoint.export_hf",
    "checkpoint.initial_hf",
    "data.tokenizer_path",
    "validation.path",
)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    """The recipe at `path` (or the defaults), then `overrides`, range-checked. An error in the
    recipe's own values names the file; one in an override names only the key."""
    cfg = JobConfig()
    if path:
        data = load_toml(path)  # its errors name the file already
        try:
            cfg = from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        base = Path(path).resolve().parent
        for key in RECIPE_RELATIVE_PATHS:
            value, default = get_key(cfg, key), get_key(JobConfig(), key)
            if value and value != default and not Path(value).is_absolute():
                set_key(cfg, key, str(base / value))
    overridden = _apply_overrides(cfg, overrides or [])
    try:
        return check_ranges(cfg)
    except RangeError as e:
        # a default is always in range, so a value no override set is the recipe's
        raise ConfigError(f"{path}: {e}" if path and e.key not in overridden else str(e)) from None


class RangeError(ConfigError):
    """A resolved value outside its field's range; `key` is the field ("optimizer.lr")."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _finite(value: Any) -> bool:
    """No NaN or infinity anywhere in `value` (a number, or a table or list of them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def check_ranges(cfg: JobConfig) -> JobConfig:
    """Reject a value outside its field's declared range (sections.py, `checked`), and NaN or
    infinity in any field (no field means either): the whole config is checked once it is
    resolved, so an override may correct a recipe's value."""
    for sec in dataclasses.fields(cfg):
        section = getattr(cfg, sec.name)
        for f in dataclasses.fields(section):
            accepted = f.metadata.get("range")
            value = getattr(section, f.name)
            key = f"{sec.name}.{f.name}"
            if not _finite(value):
                rule = f"{accepted} (a finite number)" if accepted is not None else "made of finite numbers"
                raise RangeError(key, f"{key} = {value!r} is out of range: it must be {rule}")
            if accepted is not None and not accepted.accepts(value):
                raise RangeError(key, f"{key} = {value!r} is out of range: it must be {accepted}")
    return cfg


def to_dict(cfg: JobConfig) -> dict:
    return dataclasses.asdict(cfg)


def to_toml(cfg: JobConfig) -> str:
    return tomli_w.dumps(to_dict(cfg))


def describe(cls=JobConfig) -> dict[str, dict[str, str]]:
    """{section: {key: docstring}} read from the attribute docstrings in sections.py."""
    out: dict[str, dict[str, str]] = {}
    for sec in dataclasses.fields(cls):
        sec_cls = typing.get_type_hints(cls)[sec.name]
        tree = ast.parse(inspect.getsource(sec_cls))
        body = tree.body[0].body
        docs: dict[str, str] = {}
        for node, nxt in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = str(nxt.value.value)
        out[sec.name] = docs
    return out
