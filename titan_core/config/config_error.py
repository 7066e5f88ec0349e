"""The config's error: bad user input in a recipe, an override or a config file (exit code 2)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input in a recipe or an override; entry points turn it into exit code 2."""
