"""Config tree, TOML loading, overrides and the module-swap registry."""

from titan_core.config.loader import ConfigError, apply_overrides, describe, from_dict, load_config, to_dict, to_toml
from titan_core.config.sections import JobConfig

__all__ = [
    "ConfigError",
    "JobConfig",
    "apply_overrides",
    "describe",
    "from_dict",
    "load_config",
    "to_dict",
    "to_toml",
]
