"""Entry point: `python -m titan_core.train --config recipe.toml [--section.key=value ...]`.

torchrun-ready: rank, world size and local rank come from RANK / WORLD_SIZE / LOCAL_RANK.
`--nproc N` starts N local processes through titan_core.launcher instead.
Bad input (unknown key, wrong type, missing file, unknown family, unavailable device)
prints one line and exits 2, without a traceback.
"""

from __future__ import annotations

import os
import sys

from titan_core.config.loader import ConfigError, load_config, to_toml
from titan_core.config.sections import JobConfig

USAGE = """usage: python -m titan_core.train [--config RECIPE.toml] [--print-config] [--nproc N] [--section.key=value ...]

  --config PATH      TOML recipe (sections: model, training, data, optimizer, lr_scheduler,
                     parallelism, compile, kernels, checkpoint, metrics, profiler, device, tpu)
  --print-config     print the resolved config as TOML and exit
  --nproc N          start N local processes (ranks 0..N-1 of one world) and wait for them
  --repeat-batch     train on the first batch at every step (what the eager gate does)
  --section.key=V    override one field, e.g. --training.steps=50 --model.flavor=debugmodel
"""


def run(cfg: JobConfig, *, quiet: bool = False, repeat_batch: bool = False):
    """Train as configured and return the TrainResult (metrics per step and model facts)."""
    from titan_core.trainer import Trainer

    trainer = Trainer(cfg, quiet=quiet, repeat_batch=repeat_batch)
    return trainer.train()


def parse_argv(argv: list[str]) -> tuple[str | None, bool, list[str]]:
    config, print_config, overrides = None, False, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            raise SystemExit(USAGE)
        if arg == "--print-config":
            print_config = True
        elif arg == "--config" or arg.startswith("--config="):
            if "=" in arg:
                config = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                config = argv[i + 1]
                i += 1
            else:
                raise ConfigError("--config needs a path")
        else:
            overrides.append(arg)
        i += 1
    return config, print_config, overrides


def _pop_option(argv: list[str], name: str, *, takes_value: bool) -> tuple[str | bool | None, list[str]]:
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        nproc, argv = _pop_option(argv, "--nproc", takes_value=True)
        repeat_batch, argv = _pop_option(argv, "--repeat-batch", takes_value=False)
        if nproc is not None:
            if not str(nproc).isdigit():
                raise ConfigError(f"--nproc expects a positive integer, got '{nproc}'")
            from titan_core.launcher import launch

            return launch(argv + (["--repeat-batch"] if repeat_batch else []), int(nproc))
        config, print_config, overrides = parse_argv(argv)
        cfg = load_config(config, overrides)
        if print_config:
            sys.stdout.write(to_toml(cfg))
            return 0
        result = run(cfg, repeat_batch=bool(repeat_batch))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if not _is_dist_error(e):
            raise
        # the traceback of a failed collective says little; say what it usually means
        print(
            f"error: rank {os.environ.get('RANK', '0')}: a collective failed: {str(e).strip().splitlines()[-1]}\n"
            "another rank died or is stuck (a timeout fires after parallelism.timeout_s seconds)",
            file=sys.stderr,
        )
        return 1
    if result.summary is not None:
        from rich.console import Console

        Console(stderr=True).print(result.summary)
    return 0 if result.metrics and all(_finite(m["loss"]) for m in result.metrics) else 1


def _is_dist_error(e: BaseException) -> bool:
    """A torch.distributed error (NCCL and the c10d layer raise these; gloo raises RuntimeError)."""
    dist = sys.modules.get("torch.distributed")  # not imported: nothing distributed ran
    return dist is not None and isinstance(e, getattr(dist, "DistError", ()))


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


if __name__ == "__main__":
    sys.exit(main())
