"""Entry point: `python -m titan_core.train --config recipe.toml [--section.key=value ...]`.

torchrun-ready: rank, world size and local rank come from RANK / WORLD_SIZE / LOCAL_RANK.
`--nproc N` starts N local processes through titan_core.launcher instead.
Bad input (unknown key, wrong type, a value outside its field's range, missing file, unknown
family, unavailable device) prints one line and exits 2, without a traceback, before anything
is written. Under torchrun every rank meets the same bad input, so only local rank 0 prints the
line (one per host, not one per rank); every rank also hands it to torchrun's error file (`refuse`).
A run stopped by a non-finite loss prints one line naming the step, the loss and
the last finite grad norm, and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import time

from titan_core.runtime.argv import parse_argv, pop_option
from titan_core.config.loader import ConfigError, check_ranges, load_config, to_toml
from titan_core.config.sections import JobConfig
from titan_core.launcher import launch


def run(cfg: JobConfig, *, quiet: bool = False):
    """Train as configured and return the TrainResult (metrics per step and model facts; `stopped`
    says why a run ended early). A config made or edited in code is range-checked here too."""
    from titan_core.training.trainer import Trainer  # lazy: models and torch load only when a run starts

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
        return refuse(str(e))
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
        from rich.console import Console  # lazy: rich loads only to print a summary

        Console(stderr=True).print(result.summary)
    if result.stopped:
        print(f"error: {result.stopped}", file=sys.stderr)
        return 1
    if not result.metrics:  # resumed from a checkpoint at (or past) the last step
        print(f"nothing to train: resumed at step {result.resumed_from} of {cfg.training.steps}", file=sys.stderr)
    return 0


def refuse(message: str) -> int:
    """Say a refusal of bad input once per host and return its exit code, 2.

    Local rank 0 (or a process started without torchrun) prints `error: MESSAGE` on stderr; the other
    ranks stay silent. Then every rank writes the line to TORCHELASTIC_ERROR_FILE, the file torchrun
    gives each rank for its failure: torchrun's own report shows it, and titan_core.launch prints it when
    no local rank 0 said it, so a refusal that only one rank meets (its data shard) is not lost. Local rank
    0 writes it after printing, so its file says it printed, even when torchrun stopped it before its exit
    (another rank refused first)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"error: {message}", file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:  # torchrun reads {"message": str, "timestamp": seconds} (its ProcessFailure)
            with open(error_file, "w") as f:
                json.dump({"message": f"error: {message}", "timestamp": int(time.time())}, f)
        except OSError:  # its folder gone (torchrun stopping): the exit code still says bad input
            pass
    return 2


def _is_dist_error(e: BaseException) -> bool:
    """A torch.distributed error (NCCL and the c10d layer raise these; gloo raises RuntimeError)."""
    dist = sys.modules.get("torch.distributed")  # not imported: nothing distributed ran
    return dist is not None and isinstance(e, getattr(dist, "DistError", ()))


if __name__ == "__main__":
    sys.exit(main())
