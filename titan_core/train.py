"""Entry point: `python -m titan_core.train --config recipe.toml [--section.key=value ...]`.

torchrun-ready: rank, world size and local rank come from RANK / WORLD_SIZE / LOCAL_RANK.
`--nproc N` starts N local processes through titan_core.runtime.launcher instead.
Bad input (unknown key, wrong type, a value outside its field's range, missing file, unknown
family, unavailable device) prints one line and exits 2, without a traceback, before anything
is written. A run stopped by a non-finite loss prints one line naming the step, the loss and
the last finite grad norm, and exits 1.
"""

from __future__ import annotations

import os
import sys

from titan_core.runtime.argv import parse_argv, pop_option
from titan_core.config.loader import ConfigError, check_ranges, load_config, to_toml
from titan_core.config.sections import JobConfig
from titan_core.runtime.launcher import launch


def run(cfg: JobConfig, *, quiet: bool = False):
    """Train as configured and return the TrainResult (metrics per step and model facts; `stopped`
    says why a run ended early). A config made or edited in code is range-checked here too."""
    from titan_core.training.trainer import Trainer  # import-time cost: models and torch load only when a run starts

    trainer = Trainer(check_ranges(cfg), quiet=quiet)
    return trainer.train()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        nproc, argv = pop_option(argv, "--nproc", takes_value=True)
        if nproc is not None:
            if not str(nproc).isdigit():
                raise ConfigError(f"--nproc expects a positive integer, got '{nproc}'")
            return launch(argv, int(nproc))
        config, print_config, overrides = parse_argv(argv)
        cfg = load_config(config, overrides)
        if print_config:
            sys.stdout.write(to_toml(cfg))
            return 0
        result = run(cfg)
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
        from rich.console import Console  # import-time cost: rich loads only to print a summary

        Console(stderr=True).print(result.summary)
    if result.stopped:
        print(f"error: {result.stopped}", file=sys.stderr)
        return 1
    if not result.metrics:  # resumed from a checkpoint at (or past) the last step
        print(f"nothing to train: resumed at step {result.resumed_from} of {cfg.training.steps}", file=sys.stderr)
    return 0


def _is_dist_error(e: BaseException) -> bool:
    """A torch.distributed error (NCCL and the c10d layer raise these; gloo raises RuntimeError)."""
    dist = sys.modules.get("torch.distributed")  # not imported: nothing distributed ran
    return dist is not None and isinstance(e, getattr(dist, "DistError", ()))


if __name__ == "__main__":
    sys.exit(main())
