"""`python -m titan_core.launch [torchrun's options] -m titan_core.train --config RECIPE [--section.key=value ...]`:
torchrun, with bad input said once and a failed rank said in one line.

It is torchrun: its options are parsed by torchrun's own parser (`torch.distributed.run.parse_args`) and
the ranks are started by torchrun's own launcher (`torch.distributed.run.run`), so a multi-host run takes
the same rendezvous options (--nnodes, --node-rank, --rdzv-backend, --rdzv-endpoint, --rdzv-id,
--master-addr, --master-port) and the same --log-dir / --redirects / --tee. What plain torchrun cannot do,
and this adds:

- Before any rank starts, when the program is `-m titan_core.train`: its config is loaded and checked
  (every key and range, the parallel degrees against the world when --nnodes is one number, the device
  count, the data, held-out and tokenizer paths). Bad input is one line, exit 2, and no rank starts.
- Bad input only a rank can find (a model-level check: ep on a dense model) is said once: local rank
  0 prints it (titan_core.train's `refuse`); when only other ranks refused, the line one of them left
  in torchrun's error file is printed here. Exit 2, without torchrun's report.
- Any other failure of a rank: one line (the rank, its exit code or signal, what it raised when it
  said so, where its output is), exit 1, in place of torchrun's `ChildFailedError` traceback. Each
  rank's own output is where torchrun puts it: this console, or the files of --log-dir with --redirects.
- Ctrl-C or SIGTERM: torchrun stops the ranks; "interrupted", exit 130 / 143.

Under plain `torchrun` the ranks refuse bad input the same way (once per host), but torchrun's own
process turns any rank's failure, a refusal included, into its traceback and exit 1.

Exit codes: 0, 1 (a rank failed, or torchrun itself: its rendezvous), 2 (bad input), 130 / 143.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from titan_core.config.loader import ConfigError, load_config
from titan_core.runtime.argv import parse_argv
from titan_core.launcher import check_nproc, cpu_count

TRAIN = "titan_core.train"
NO_MESSAGE = ("To enable traceback see", "Signal ")
"""The starts of what torchrun says of a rank that left no message of its own (no error file; a signal)."""
ROUTINE = (
    "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s",
    "Sending process %s closing signal %s",
    "Closing process %s via signal %s",
    "Received %s death signal, shutting down workers",
)
"""torchrun's log records of a failure or a stop that the one line here says instead."""


class _Routine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in ROUTINE


def _quiet_routine_records() -> None:
    """Drop ROUTINE from torchrun's loggers (its other warnings, a rendezvous waiting for hosts, stay)."""
    for name in ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api"):
        logging.getLogger(name).addFilter(_Routine())


def _world(torchrun, args) -> tuple[int | None, int]:
    """(the number of ranks when torchrun's options fix it (--nnodes N, not MIN:MAX), else None; the
    ranks on this host), as torchrun works them out."""
    low, high = torchrun.parse_min_max_nnodes(args.nnodes)
    per_host = torchrun.determine_local_world_size(args.nproc_per_node)
    return (low * per_host if low == high else None), per_host


def preflight(train_args: list[str], world: int | None, per_host: int) -> None:
    """The checks of a titan_core.train command line that need no rank (ConfigError, one line)."""
    from titan_core.data.loader import check_data_paths  # lazy: torch, only once the options parsed
    from titan_core.lora.inject import check_lora  # lazy: as above
    from titan_core.parallel import check_parallelism  # lazy: as above

    config, print_config, overrides = parse_argv(list(train_args))
    cfg = load_config(config, overrides)
    for warning in check_nproc(per_host, cfg.device.type):
        print(f"warning: {warning}", file=sys.stderr)
    if world is not None:
        check_parallelism(cfg, world)
    check_lora(cfg, world or per_host)
    if not print_config:
        check_data_paths(cfg)


def _message(failure) -> str | None:
    """What a failed rank said in torchrun's error file (a string, or torchrun's own JSON of an exception)."""
    said = failure.message
    if isinstance(said, dict):
        said = said.get("message")
    if not isinstance(said, str) or not said.strip() or said.startswith(NO_MESSAGE):
        return None
    return said.strip().splitlines()[-1]


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def report(failures: dict, first: int, args, world: int | None) -> tuple[int, str | None]:
    """(exit code, the line to print or None) for torchrun's failed ranks {global rank: ProcessFailure}, the
    first of them `first` (torchrun's root cause)."""
    # bad input a rank found: exit 2, or an `error: ` line in its error file (train.refuse writes it, then
    # exits 2, unless torchrun stopped it in between because another rank refused first)
    refused = {r: f for r, f in failures.items() if f.exitcode == 2 or (_message(f) or "").startswith("error: ")}
    if refused:
        if any(f.local_rank == 0 for f in refused.values()):  # train.refuse printed it there, before its file
            return 2, None
        rank = first if first in refused else min(refused)
        said = _message(refused[rank]) or f"rank {rank} refused its input (exit code 2); its output says why"
        return 2, said if said.startswith("error: ") else f"error: {said}"
    failure = failures[first]
    of = f" of {world}" if world else ""
    said = _message(failure)
    line = f"error: rank {first}{of} failed first ({_how(failure.exitcode)})" + (f": {said}" if said else "")
    stopped = -signal.SIGTERM
    others = [f"rank {r} {'stopped' if f.exitcode == stopped else _how(f.exitcode)}"
              for r, f in sorted(failures.items()) if r != first]  # fmt: skip
    if others:
        line += f"; then {', '.join(others)}"
    if args.log_dir and (args.redirects != "0" or args.tee != "0"):
        line += f"; each rank's output: under {args.log_dir} (<run id>/attempt_<n>/<local rank>/)"
    else:
        line += "; each rank's output is above"
    return 1, line


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from torch.distributed import run as torchrun  # lazy: torch; importing this module stays torch-free
    from torch.distributed.elastic.multiprocessing.api import SignalException  # lazy: as above
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # lazy: as above

    args = torchrun.parse_args(argv)  # torchrun's own parser: a bad option is its usage and exit 2
    try:
        world, per_host = _world(torchrun, args)
        if args.module and args.training_script == TRAIN:
            preflight(args.training_script_args, world, per_host)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:  # torchrun's option values: --nnodes x, --nproc-per-node gpu without one
        print(f"error: {e}", file=sys.stderr)
        return 2
    _quiet_routine_records()
    if "OMP_NUM_THREADS" not in os.environ:  # a share of the cores per rank (torchrun sets 1, with a warning)
        os.environ["OMP_NUM_THREADS"] = str(max(1, cpu_count() // max(1, per_host)))
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        code, line = report(e.failures, e.get_first_failure()[0], args, world)
        if line:
            print(line, file=sys.stderr)
        return code
    except SignalException as e:  # torchrun stopped its ranks before raising it
        print("interrupted: all ranks stopped", file=sys.stderr)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:  # Ctrl-C before torchrun's handlers were in place
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # torchrun's own failure (a rendezvous that timed out, a port in use): its message
        print(f"error: torchrun failed: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1]}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
