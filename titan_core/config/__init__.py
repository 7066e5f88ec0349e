"""Config tree, TOML loading, overrides, dotted-key access and the module-swap registry."""

from titan_core.config.loader import (
    ConfigError,
    apply_overrides,
    describe,
    from_dict,
    get_key,
    load_config,
    set_key,
    to_dict,
    to_toml,
    with_keys,
)
from titan_core.config.sections import JobConfig

__all__ = [
    "ConfigError",
    "JobConfig",
    "apply_overrides",
    "describe",
    "from_dict",
    "get_key",
    "load_config",
    "set_key",
    "to_dict",
    "to_toml",
    "with_keys",
]
