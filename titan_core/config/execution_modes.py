"""The execution mode a config trains in, read from its switches in this one place.

A config has one switch per mode beyond eager (MODE_KEYS), so it can hold two at once. Every reader
(the trainer, its checks, the memory estimate, and any caller that plans or times a run) asks
`execution_mode`, so such a config meets the same refusal wherever it is read, and no reader quietly
prefers one switch.
"""

from __future__ import annotations

from typing import Any, Literal

from titan_core.config.config_error import ConfigError
from titan_core.config.loader import get_key, set_key

Mode = Literal["eager", "compile", "graph_trainer"]

MODES: tuple[Mode, ...] = ("eager", "compile", "graph_trainer")
"""Every execution mode, simplest first: each captures more of the step than the one before."""

MODE_KEYS: dict[str, str] = {"compile": "compile.enable", "graph_trainer": "graph_trainer.enable"}
"""The config key that switches each mode beyond eager on (eager: none of them on)."""

TWO_MODES = (
    "compile.enable and graph_trainer.enable are two execution modes; pick one "
    "(the Graph Trainer compiles the whole step itself with graph_trainer.compile=inductor)"
)
"""The refusal of a config with both switches on."""


def execution_mode(cfg: Any) -> Mode:
    """The mode `cfg` (a JobConfig, or a recipe dict: a missing switch is off) trains in; ConfigError
    (TWO_MODES) when both switches are on."""
    on = [mode for mode, key in MODE_KEYS.items() if _switch(cfg, key)]
    if len(on) > 1:
        raise ConfigError(TWO_MODES)
    return on[0] if on else "eager"


def _switch(cfg: Any, key: str) -> bool:
    if isinstance(cfg, dict):  # a recipe as written leaves out what it does not turn on
        return bool(get_key(cfg, key, False))
    section, name = key.split(".")
    return bool(getattr(getattr(cfg, section), name))


def mode_switches(mode: str) -> dict[str, bool]:
    """{key: value} of every switch, as they are when a config trains in `mode`."""
    if mode not in MODES:
        raise ValueError(f"unknown execution mode '{mode}' (one of {', '.join(MODES)})")
    return {key: m == mode for m, key in MODE_KEYS.items()}


def set_execution_mode(cfg: Any, mode: str) -> None:
    """Switch `cfg` (a JobConfig or a recipe dict) to `mode`, every other mode off."""
    for key, on in mode_switches(mode).items():
        set_key(cfg, key, on)
