"""Start N local training processes through torchrun, watch them, and report the rank that failed.

`launch(argv, nproc)` is what `python -m titan_core.train --nproc N` (and any command that wraps
it) calls, `run_world(cfg, nproc)` what a caller that compares runs calls. Both start one child,
torchrun itself (`torchrun_command`: `python -m torch.distributed.run --standalone --nnodes=1
--nproc-per-node=N ... -m titan_core.train ARGV`), so the ranks get what a multi-host run gets
from the same entry point, and torchrun stops every rank as soon as one fails. Added around it:

- dying with the caller: torchrun runs under die_with_parent asking for SIGTERM, which it turns
  into stopping its ranks (a SIGKILL would leave them running, each in a session of its own);
- per-rank logs: torchrun writes each rank's stdout and stderr to files, which are followed into
  `rank_<r>.log` (both streams, in the order read), a tail per rank and, if asked, rank 0's echo,
  which stops where rank 0 starts a traceback: the failure is reported once, at the end, and the
  traceback stays in its log;
- a bound: `timeout_s` ends a run that outlives it (a hang torchrun would wait on for ever);
- a report: the rank torchrun names as the first failure, its exit code, its exception and the
  tail of its output, and what became of the other ranks; for a rank killed by a signal (kill -9,
  the OOM killer), which left no traceback of its own, one line: which rank, which signal, where
  the logs are.

`LaunchResult.exit_code`: 0, the failing rank's code (128 + signal when killed), 124 on timeout, 2 for
bad input found before anything starts. `launch` (the command line) exits 0, 2 (bad input), 124 or 1
for every other failure (a killed rank included: it is the run that failed, not the launcher). An
interrupt of the launcher itself (Ctrl-C's KeyboardInterrupt, or whatever exception a SIGTERM handler
of the caller raises) stops torchrun, which stops its ranks, and then goes on up to the caller: it is
the caller's run that was interrupted, and a result with a nonzero code would read as a failed run.
`launch` (the command line) turns a Ctrl-C into exit 130.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from titan_core.runtime.argv import parse_argv
from titan_core.config.loader import ConfigError, check_ranges, load_config, to_toml
from titan_core.runtime.die_with_parent import with_parent_death_signal

TAIL_LINES = 30
EXIT_TIMEOUT = 124
POLL_S = 0.05
"""How often torchrun is polled and the ranks' files are read."""
MONITOR_S = 0.02
"""torchrun's poll of its ranks: two that fail within it of each other are told apart by rank number only."""
SHUTDOWN_S = 3
"""How long torchrun gives a rank it stops (SIGTERM) before SIGKILL."""


@dataclass
class LaunchResult:
    exit_code: int
    """0 when every rank exited 0 (see the module docstring for the others)."""
    failure: str | None
    """The report of the first failure: rank, exit code and the tail of its output."""
    failed_rank: int | None
    elapsed_s: float
    tails: list[list[str]] = field(default_factory=list)
    """The last output lines of every rank."""
    log_dir: Path | None = None
    command: list[str] = field(default_factory=list)
    """The torchrun command line that ran the world (`python -m torch.distributed.run ...`)."""
    errors: dict[int, str] = field(default_factory=dict)
    """What ranks wrote to torchrun's error file (TORCHELASTIC_ERROR_FILE), by rank: the refusal of a
    rank that does not print it (titan_core.train's `refuse`)."""

    def refusal(self) -> str:
        """The failed rank's own one-line refusal (its last `error: ...` line, or what it wrote to its error
        file, without the prefix): what a rank that exits 2 says of its bad input; else the first line of
        the failure report."""
        rank = self.failed_rank
        lines = self.tails[rank] if rank is not None and rank < len(self.tails) else []
        said = [*lines, self.errors.get(rank, "")] if rank is not None else lines
        for line in reversed(said):
            if line.strip().startswith("error: "):
                return line.strip().removeprefix("error: ")
        return (self.failure or f"exit code {self.exit_code}").splitlines()[0]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def check_nproc(nproc: int, device_type: str) -> list[str]:
    """Warnings about `nproc` on this machine; ConfigError when it cannot work at all."""
    import torch  # lazy: the launcher is imported by entry points that may never need torch
    from titan_core.runtime.devices import device_type as resolved  # lazy: torch, as above

    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    kind = resolved(device_type)
    if kind == "cuda" and nproc > torch.cuda.device_count():
        raise ConfigError(
            f"--nproc {nproc} but this host has {torch.cuda.device_count()} CUDA device(s): one process per device"
        )
    cores = cpu_count()
    if kind == "cpu" and nproc > cores:
        return [
            (
                f"--nproc {nproc} exceeds the {cores} CPU core(s) here: the processes share cores "
                "(each runs 1 thread) and every step waits for the slowest; use --nproc <= cores to measure speed"
            )
        ]
    return []


def torchrun_command(cmd: list[str], nproc: int, rank_files: Path) -> list[str]:
    """torchrun's command line running `cmd` (`python -m MODULE ...`, `python SCRIPT ...` or any other
    program) as ranks 0..nproc-1 on this host, each rank's stdout and stderr redirected under `rank_files`."""
    python = len(cmd) > 1 and cmd[0] == sys.executable and (cmd[1] == "-m" or not cmd[1].startswith("-"))
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc-per-node={nproc}",
        f"--log-dir={rank_files}", "--redirects=3", f"--monitor-interval={MONITOR_S}",
        f"--shutdown-timeout={SHUTDOWN_S}", *(cmd[1:] if python else ["--no-python", *cmd]),
    ]  # fmt: skip


def _env(nproc: int, extra: dict[str, str] | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # a share of the cores per rank (torchrun would set 1 thread; every core each would oversubscribe)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // nproc)))
    env.update(extra or {})
    return env


class _RankOutput:
    """The ranks' output as torchrun's files of it grow: whole lines into rank_<r>.log, the tails, the echo."""

    def __init__(self, root: Path, nproc: int, log_dir: Path | None, echo_rank0: bool):
        self.root, self.echo_rank0 = root, echo_rank0
        self.tails = [collections.deque(maxlen=TAIL_LINES) for _ in range(nproc)]
        self.logs = [open(log_dir / f"rank_{r}.log", "w") if log_dir else None for r in range(nproc)]
        self.echoing = echo_rank0
        """Still echoing rank 0: off from the first line of a traceback on (the report at the end says it once)."""
        self.files: dict[tuple[int, str], object] = {}
        self.partial: dict[tuple[int, str], str] = {}

    def _file(self, rank: int, stream: str):
        if (rank, stream) not in self.files:  # torchrun's layout: <run id>/attempt_0/<local rank>/stdout.log
            found = next(self.root.glob(f"*/attempt_0/{rank}/{stream}.log"), None)
            if found is None:
                return None
            self.files[rank, stream] = open(found, errors="replace")
        return self.files[rank, stream]

    def read(self, final: bool = False) -> None:
        """Take in what the ranks wrote since the last call; `final`: a last line without its newline too."""
        for rank, log in enumerate(self.logs):
            for stream in ("stdout", "stderr"):
                if (f := self._file(rank, stream)) is None:
                    continue
                *lines, rest = (self.partial.pop((rank, stream), "") + f.read()).split("\n")
                if rest and final:
                    lines.append(rest)
                elif rest:
                    self.partial[rank, stream] = rest
                for line in lines:
                    self.tails[rank].append(line)
                    if log:
                        log.write(line + "\n")
                    if self.echoing and rank == 0:
                        self.echoing = not _TRACEBACK.match(line)
                        if self.echoing:
                            print(line, file=sys.stderr, flush=True)
            if log:
                log.flush()

    def errors(self) -> dict[int, str]:
        """The messages ranks left in torchrun's error files (`<run>/attempt_0/<rank>/error.json`), by rank."""
        out = {}
        for file in self.root.glob("*/attempt_0/*/error.json"):
            try:
                message = json.loads(file.read_text()).get("message")
            except (OSError, ValueError, AttributeError):  # a rank killed while writing it: no message
                continue
            if isinstance(message, dict):  # torchrun's own format for an uncaught exception (its @record)
                message = message.get("message")
            if isinstance(message, str) and file.parent.name.isdigit():
                out[int(file.parent.name)] = message
        return out

    def last_output(self, rank: int) -> float | None:
        """When the rank last wrote (seconds since the epoch): about when it failed, for one that did."""
        times = [os.stat(f.name).st_mtime for (r, _), f in self.files.items() if r == rank]
        return max(times, default=None)

    def close(self) -> None:
        for f in [*self.files.values(), *self.logs]:
            if f:
                f.close()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to torchrun, which stops its ranks (SHUTDOWN_S each at most); SIGKILL if it is still there."""
    for sig, wait_s in ((signal.SIGTERM, SHUTDOWN_S + 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def _shell_code(code: int) -> int:
    """A Popen return code as a shell's exit status: 128 + the signal for a process killed by one."""
    return code if code >= 0 else 128 - code


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_TRACEBACK = re.compile(r"^(?:\[rank\d+\]:\s*)?Traceback \(most recent call last\):")
"""The first line of a Python traceback, with the rank prefix torch's excepthook adds under torchrun."""
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)(?::\s.*)?)$")


def exception_line(lines: list[str]) -> str | None:
    """The last line of a traceback's tail that names the exception ("RuntimeError: ..."), without the
    rank prefix torchrun-style output carries; None when the tail holds none."""
    for line in reversed(lines):
        m = _EXCEPTION.match(line.strip())
        if m:
            return m.group(1)
    return None


def _tail_block(lines: list[str]) -> str:
    return "\n".join(f"  | {line}" for line in lines) if lines else "  | (no output)"


_FAILED = re.compile(r"rank\s*: (\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*: (-?\d+)")


def torchrun_failures(output: str) -> list[tuple[int, int]]:
    """(rank, exit code) of every failed rank in the summary torchrun prints when a rank fails, its
    root cause (the first failure it observed) first; [] when the output holds no such summary."""
    before, found, root = output.rpartition("Root Cause (first observed failure):")
    if not found:
        return []
    others = _FAILED.findall(before[before.rfind("Failures:") :])
    return [(int(r), int(c)) for r, c in _FAILED.findall(root)[:1] + others]


def launch_command(
    cmd: list[str],
    nproc: int,
    *,
    log_dir: Path | None = None,
    timeout_s: float | None = None,
    echo_rank0: bool = False,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Run `cmd` as ranks 0..nproc-1 of one world through torchrun and wait for it (see module docstring)."""
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="titan-torchrun-") as tmp:
        command = torchrun_command(cmd, nproc, Path(tmp) / "ranks")
        output = _RankOutput(Path(tmp) / "ranks", nproc, log_dir, echo_rank0)
        t0, started = time.monotonic(), time.time()
        timed_out = False
        with open(Path(tmp) / "torchrun.log", "w+", errors="replace") as said:
            # a session of its own, so that a terminal's Ctrl-C reaches the caller alone, which decides
            proc = subprocess.Popen(
                with_parent_death_signal(command, signal.SIGTERM), env=_env(nproc, env), stdout=said,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                while proc.poll() is None:
                    output.read()
                    if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                        timed_out = True
                        break
                    time.sleep(POLL_S)
            finally:  # also on an interrupt, which then goes on up once torchrun has stopped the ranks
                _stop(proc)
                output.read(final=True)
                output.close()
            said.seek(0)
            code, failure, rank = _summarise(nproc, proc.returncode, said.read(), output, started,
                                             timeout_s=timeout_s if timed_out else None)  # fmt: skip
            errors = output.errors()
    if failure and log_dir is not None:
        failure += f"; each rank's output: {log_dir}/rank_<r>.log"
    tails = [list(t) for t in output.tails]
    return LaunchResult(code, failure, rank, time.monotonic() - t0, tails, log_dir, command, errors)


def _summarise(
    nproc: int, code: int, said: str, output: _RankOutput, started: float, *, timeout_s: float | None
) -> tuple[int, str | None, int | None]:
    """(exit code, report, failed rank) of a finished torchrun: who failed first, with its tail, and the others."""
    if timeout_s is not None:
        return EXIT_TIMEOUT, (
            f"error: the {nproc}-process run did not finish within {timeout_s:g} s and was stopped; "
            f"the last lines of rank 0:\n{_tail_block(list(output.tails[0]))}"
        ), None  # fmt: skip
    if code == 0:
        return 0, None, None
    failures = torchrun_failures(said)
    if not failures:  # torchrun itself failed (its arguments, the rendezvous): its own output says why
        said_last = _tail_block(said.splitlines()[-TAIL_LINES:])
        return _shell_code(code), f"error: torchrun failed ({_describe_exit(code)}):\n{said_last}", None
    (rank, code), *after = failures
    if code < 0 and code != -signal.SIGTERM:  # killed from outside: no traceback, its tail says nothing of why
        others = [f"rank {r} {'stopped' if c == -signal.SIGTERM else _describe_exit(c)}" for r, c in after]
        then = f"; then {', '.join(others)}" if others else ""
        return _shell_code(code), (f"error: rank {rank} of {nproc} was {_describe_exit(code)} "
                   f"{time.time() - started:.1f} s after start (a signal from outside the run: kill, the "
                   f"out-of-memory killer){then}"), rank  # fmt: skip
    tail = list(output.tails[rank])
    raised = exception_line(tail)  # first: a one-line summary of this message (a table, a log line) says what failed
    last = output.last_output(rank)
    when = f", {last - started:.1f} s after start" if last is not None else ""
    msg = (f"error: rank {rank} of {nproc} failed first ({_describe_exit(code)}{when})"
           f"{f': {raised}' if raised else ''}; the last lines of its output:\n{_tail_block(tail)}")  # fmt: skip
    others = [f"rank {r} {_describe_exit(c)}" for r, c in after if c != -signal.SIGTERM]
    if others:
        msg += "\nthen " + "; ".join(others) + " (typically failing in a collective with the rank that died)"
    if stopped := [str(r) for r, c in after if c == -signal.SIGTERM]:
        msg += (
            f"\nstill running, so stopped: rank(s) {', '.join(stopped)}. If rank {rank} failed because a "
            "collective timed out (parallelism.timeout_s), the rank that never joined it is among these: "
            "look for where it was stuck in its log"
        )
    return _shell_code(code), msg, rank


def launch(argv: list[str], nproc: int, *, timeout_s: float | None = None) -> int:
    """`python -m titan_core.train ARGV` on `nproc` local processes; returns the exit code.

    Bad input (config errors, degrees that do not fit `nproc`, TP without a plan, a data or tokenizer
    path that does not exist) exits 2 before any process starts; what only a rank can find (a model-level
    check, an init its shards cannot reproduce) exits 2 too, with that rank's one `error:` line. Rank 0's
    output is echoed up to a traceback; every rank's output goes to `<metrics.output_dir>/logs/rank_<r>.log`.
    """
    from titan_core.data.loader import check_data_paths  # lazy: torch loads only when a run starts
    from titan_core.lora.inject import check_lora  # lazy: torch, as above
    from titan_core.parallel import check_parallelism  # lazy: torch, as above

    try:
        config, print_config, overrides = parse_argv(list(argv))
        cfg = load_config(config, overrides)
        for warning in check_nproc(nproc, cfg.device.type):
            print(f"warning: {warning}", file=sys.stderr)
        check_parallelism(cfg, nproc)
        check_lora(cfg, nproc)
        if not print_config:
            check_data_paths(cfg)  # once here, not once per rank
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if print_config:
        sys.stdout.write(to_toml(cfg))
        return 0
    cmd = [sys.executable, "-m", "titan_core.train", *argv]
    try:
        result = launch_command(
            cmd, nproc, log_dir=Path(cfg.metrics.output_dir) / "logs", timeout_s=timeout_s, echo_rank0=True
        )
    except KeyboardInterrupt:
        print("interrupted: all ranks stopped", file=sys.stderr)
        return 130
    return finish(result)


def finish(result: LaunchResult) -> int:
    """Say how an echoed run (`echo_rank0`) ended and return the command line's exit code: a rank's
    refusal as its one line (unless rank 0's echo said it already), exit 2; any other failure as the
    report, exit 1 (124 for a timeout)."""
    if result.exit_code == 2:  # a rank refused its input (a ConfigError): its one line, as one process says it
        line = f"error: {result.refusal()}"
        if not any(said.strip() == line for said in (result.tails[0] if result.tails else [])):  # not echoed yet
            print(line, file=sys.stderr)
    elif result.failure:
        print(result.failure, file=sys.stderr)
    return result.exit_code if result.exit_code in (0, 2, EXIT_TIMEOUT) else 1


@dataclass
class WorldRun:
    metrics: list[dict]
    """Rank 0's metric rows of this run, one per optimizer step (losses averaged over ranks)."""
    launch: LaunchResult

    @property
    def ok(self) -> bool:
        return self.launch.exit_code == 0


def run_world(cfg, nproc: int, *, timeout_s: float | None = None) -> WorldRun:
    """Train `cfg` on `nproc` local processes and return rank 0's per-step metrics.

    For a caller that compares runs: e.g. step-1 loss and grad norm at world size 2, or a
    bf16 loss curve, or the median step time of simple_fsdp vs fsdp2. `cfg` is a JobConfig
    and says everything the ranks do (`data.repeat_batch` included); `training.batch_size`
    is per rank, so pass the single-process batch divided by the data-parallel degree to
    see the same global batch. Raises ConfigError on bad
    input; a failed run comes back with `ok = False` and `launch.failure` saying why.
    """
    from titan_core.lora.inject import check_lora  # lazy: torch loads only when a run starts
    from titan_core.parallel import check_parallelism  # lazy: torch loads only when a run starts

    check_ranges(cfg)  # a config built in code: refused before its folder is made
    check_nproc(nproc, cfg.device.type)
    check_parallelism(cfg, nproc)
    check_lora(cfg, nproc)
    out = Path(cfg.metrics.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    recipe = out / "world_recipe.toml"
    recipe.write_text(to_toml(cfg))
    from titan_core.measure.metrics import file_stamp, read_metrics  # lazy: rich loads only for a run

    metrics_path = out / "metrics.jsonl"
    before = file_stamp(metrics_path)
    cmd = [sys.executable, "-m", "titan_core.train", "--config", str(recipe)]
    result = launch_command(cmd, nproc, log_dir=out / "logs", timeout_s=timeout_s)
    # rank 0 starts by rewriting the file to the rows its run does not supersede (a fresh run: none),
    # so its current rows are this run's (after its checkpoint's, if it resumed); a file with the
    # stamp it had before is an earlier run's, left as it was by a run that never started
    rows = read_metrics(metrics_path) if file_stamp(metrics_path) not in (None, before) else []
    return WorldRun(rows, result)
