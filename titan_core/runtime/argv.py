"""The command line of `python -m titan_core.train`: usage text, `--config`/`--print-config`, option popping.

Shared by the training entry (train.py) and the launcher, which checks a run's argv
before it starts any process.
"""

from __future__ import annotations

from titan_core.config.loader import ConfigError

LAUNCH = ("python", "-m", "titan_core.launch")
"""How a multi-process run starts: torchrun's own launcher with the config checked first (titan_core/launch.py);
torchrun's options follow, then `-m titan_core.train --config RECIPE`."""

USAGE = """usage: python -m titan_core.train [--config RECIPE.toml] [--print-config] [--nproc N] [--section.key=value ...]

  --config PATH      TOML recipe (sections: model, training, data, optimizer, lr_scheduler,
                     parallelism, compile, kernels, checkpoint, metrics, profiler, device, tpu)
  --print-config     print the resolved config as TOML and exit
  --nproc N          start N local processes (ranks 0..N-1 of one world) and wait for them
  --section.key=V    override one field, e.g. --training.steps=50 --data.repeat_batch=true
"""


def parse_argv(argv: list[str]) -> tuple[str | None, bool, list[str]]:
    """-> (recipe path or None, whether --print-config was given, the `--section.key=value` overrides)."""
    if "-h" in argv or "--help" in argv:
        raise SystemExit(USAGE)
    config, rest = pop_option(argv, "--config", takes_value=True)
    print_config, overrides = pop_option(rest, "--print-config", takes_value=False)
    return config, bool(print_config), overrides


def pop_option(argv: list[str], name: str, *, takes_value: bool) -> tuple[str | bool | None, list[str]]:
    """Remove `name` (and its value) from argv: (value, or True for a flag, or None; the rest)."""
    rest, value, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == name:
            if not takes_value:
                value = True
            elif i + 1 < len(argv):
                value = argv[i + 1]
                i += 1
            else:
                raise ConfigError(f"{name} needs a value")
        elif takes_value and arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return value, rest
