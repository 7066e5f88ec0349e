"""Start N local training processes, watch them, and report the first one that fails.

`launch(argv, nproc)` is what `python -m titan_core.train --nproc N` (and any command
that wraps it) calls: N copies of `python -m titan_core.train ARGV`, each with the torchrun
environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Multi-host runs use
torchrun itself; the training entry reads the same variables.

Why subprocesses and not torch.distributed.run: the launcher must name the rank that
failed and show the tail of *its* output, then stop the others at once; the elastic
agent restarts or waits, and shows a rank's output only if it was redirected to files.

Never a hang: a rank that dies makes the others fail in their next collective (gloo
notices the closed connection) or after `parallelism.timeout_s`; the launcher gives
them `grace_s` to exit, then terminates them. An optional `timeout_s` bounds the run.
Exit code: 0, the failing rank's code (128 + signal when killed), 124 on timeout,
2 for bad input found before anything starts.

An interrupt of the launcher itself (Ctrl-C's KeyboardInterrupt, or whatever exception a
SIGTERM handler of the caller raises) stops every rank and then goes on up to the caller:
it is the caller's run that was interrupted, and a result with a nonzero code would read as
a failed run. `launch` (the command line) turns a Ctrl-C into exit 130.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from titan_core.runtime.argv import parse_argv
from titan_core.config.loader import ConfigError, check_ranges, load_config, to_toml
from titan_core.runtime.die_with_parent import with_parent_death_signal

TAIL_LINES = 30
EXIT_TIMEOUT = 124
PORT_RETRIES = 2
_PORT_TAKEN = ("EADDRINUSE", "Address already in use", "address already in use")


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


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def check_nproc(nproc: int, device_type: str) -> list[str]:
    """Warnings about `nproc` on this machine; ConfigError when it cannot work at all."""
    import torch  # import-time cost: the launcher is imported by entry points that may never need torch

    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    kind = device_type
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(rank: int, nproc: int, port: int, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
    )  # fmt: skip
    # N processes each using every core would oversubscribe the CPU (torchrun sets 1)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // nproc)))
    env.update(extra or {})
    return env


def _pump(stream, tail: collections.deque, log_path: Path | None, echo) -> None:
    with open(log_path, "w") if log_path else open(os.devnull, "w") as log:
        for line in iter(stream.readline, ""):
            tail.append(line.rstrip("\n"))
            log.write(line)
            log.flush()
            if echo is not None:
                echo.write(line)
                echo.flush()


def _stop(procs: list[subprocess.Popen], wait_s: float) -> None:
    """SIGTERM the process groups still running, then SIGKILL after `wait_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.02)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


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


def launch_command(
    cmd: list[str],
    nproc: int,
    *,
    log_dir: Path | None = None,
    timeout_s: float | None = None,
    echo_rank0: bool = False,
    grace_s: float = 3.0,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Run `cmd` as ranks 0..nproc-1 of one world and wait for all of them (see module docstring).

    The rendezvous port is picked free and released before rank 0 binds it, so another process
    on a busy host can take it in between: a world whose ranks fail on "address already in use"
    is started again on a fresh port (at most PORT_RETRIES times), and the result says so.
    """
    retried = 0
    while True:
        result = _launch_once(cmd, nproc, _free_port(), log_dir=log_dir, timeout_s=timeout_s,
                              echo_rank0=echo_rank0, grace_s=grace_s, env=env)  # fmt: skip
        if retried >= PORT_RETRIES or not _lost_port_race(result):
            break
        retried += 1
        print(
            f"warning: the rendezvous port was taken before rank 0 bound it; starting the world again "
            f"on a fresh port ({retried} of {PORT_RETRIES})",
            file=sys.stderr,
        )
    if retried and result.failure:
        result.failure += f"\n(the world was started {retried + 1} times: its rendezvous port was taken each time)"
    return result


def _lost_port_race(result: LaunchResult) -> bool:
    return result.exit_code not in (0, 130, EXIT_TIMEOUT) and any(
        marker in line for tail in result.tails for line in tail for marker in _PORT_TAKEN
    )


def _launch_once(
    cmd: list[str],
    nproc: int,
    port: int,
    *,
    log_dir: Path | None,
    timeout_s: float | None,
    echo_rank0: bool,
    grace_s: float,
    env: dict[str, str] | None,
) -> LaunchResult:
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    tails = [collections.deque(maxlen=TAIL_LINES) for _ in range(nproc)]
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    t0 = time.monotonic()
    exits: dict[int, tuple[float, int]] = {}
    timed_out = False
    try:
        for r in range(nproc):
            # each rank in its own session (so _stop can end its whole group) and killed with
            # the launcher, which a session of its own would otherwise let it outlive
            p = subprocess.Popen(
                with_parent_death_signal(cmd), env=_child_env(r, nproc, port, env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
            )  # fmt: skip
            procs.append(p)
            log_path = log_dir / f"rank_{r}.log" if log_dir is not None else None
            th = threading.Thread(
                target=_pump,
                args=(p.stdout, tails[r], log_path, sys.stderr if echo_rank0 and r == 0 else None),
                daemon=True,
            )
            th.start()
            pumps.append(th)
        first_fail: float | None = None
        while len(exits) < nproc:
            now = time.monotonic()
            for r, p in enumerate(procs):
                if r not in exits and (code := p.poll()) is not None:
                    exits[r] = (now - t0, code)
                    if code != 0 and first_fail is None:
                        first_fail = now
            if first_fail is not None and now - first_fail > grace_s:
                break  # the others had their chance to fail with their own message
            if timeout_s is not None and now - t0 > timeout_s:
                timed_out = True
                break
            time.sleep(0.02)
    finally:  # also on an interrupt, which then goes on up once the ranks are stopped
        running = [r for r in range(len(procs)) if r not in exits]
        _stop(procs, wait_s=2.0)
        for th in pumps:
            th.join(timeout=2.0)
    elapsed = time.monotonic() - t0
    for r, p in enumerate(procs):
        exits.setdefault(r, (elapsed, p.returncode if p.returncode is not None else -signal.SIGKILL))
    tail_lists = [list(t) for t in tails]
    return _summarise(
        nproc, exits, running, tail_lists, elapsed, log_dir, timeout_s=timeout_s if timed_out else None, grace_s=grace_s
    )


def _summarise(
    nproc: int,
    exits: dict[int, tuple[float, int]],
    running: list[int],
    tail_lists: list[list[str]],
    elapsed: float,
    log_dir: Path | None,
    *,
    timeout_s: float | None,
    grace_s: float,
) -> LaunchResult:
    """The LaunchResult of a finished watch: who failed first, with its tail, and who was stopped."""
    where = f"; full logs: {log_dir}" if log_dir is not None else ""
    if timeout_s is not None:
        shown = running[0] if running else 0
        msg = (
            f"error: the {nproc}-process run did not finish within {timeout_s:g} s and was stopped "
            f"(ranks still running: {', '.join(map(str, running))}); the last lines of rank {shown}:\n"
            f"{_tail_block(tail_lists[shown])}{where}"
        )
        return LaunchResult(EXIT_TIMEOUT, msg, None, elapsed, tail_lists, log_dir)
    failed = sorted((t, r, code) for r, (t, code) in exits.items() if code != 0)
    if not failed:
        return LaunchResult(0, None, None, elapsed, tail_lists, log_dir)
    t_fail, rank, code = failed[0]
    # the exception first: a one-line summary of this message (compat's table, a log line) then says what failed
    raised = exception_line(tail_lists[rank])
    msg = (f"error: rank {rank} of {nproc} failed first ({_describe_exit(code)}, {t_fail:.1f} s after start)"
           f"{f': {raised}' if raised else ''}; the last lines of its output:\n")  # fmt: skip
    msg += _tail_block(tail_lists[rank])
    others = [f"rank {r} {_describe_exit(c)} {t - t_fail:.1f} s later" for t, r, c in failed[1:] if r not in running]
    if others:
        msg += "\nthen " + "; ".join(others) + " (typically failing in a collective with the rank that died)"
    if running:
        ranks = ", ".join(map(str, running))
        msg += (
            f"\nstill running {grace_s:g} s later, so stopped: rank(s) {ranks}. If rank {rank} failed because a "
            "collective timed out (parallelism.timeout_s), the rank that never joined it is among these: "
            "look for where it was stuck in its log"
        )
    msg += where
    exit_code = code if code > 0 else 128 + (-code)
    return LaunchResult(exit_code, msg, rank, elapsed, tail_lists, log_dir)


def launch(argv: list[str], nproc: int, *, timeout_s: float | None = None) -> int:
    """`python -m titan_core.train ARGV` on `nproc` local processes; returns the exit code.

    Bad input (config errors, degrees that do not fit `nproc`, TP without a plan) exits 2
    before any process starts. Rank 0's output is echoed; every rank's output goes to
    `<metrics.output_dir>/logs/rank_<r>.log`.
    """
    from titan_core.parallel import check_parallelism  # import-time cost: torch loads only when a run starts

    try:
        config, print_config, overrides = parse_argv(list(argv))
        cfg = load_config(config, overrides)
        for warning in check_nproc(nproc, cfg.device.type):
            print(f"warning: {warning}", file=sys.stderr)
        check_parallelism(cfg, nproc)
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
    if result.failure:
        print(result.failure, file=sys.stderr)
    return result.exit_code


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
    from titan_core.parallel import check_parallelism  # import-time cost: torch loads only when a run starts

    check_ranges(cfg)  # a config built in code: refused before its folder is made
    check_nproc(nproc, cfg.device.type)
    check_parallelism(cfg, nproc)
    out = Path(cfg.metrics.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    recipe = out / "world_recipe.toml"
    recipe.write_text(to_toml(cfg))
    from titan_core.measure.metrics import file_stamp, read_metrics  # import-time cost: rich loads only for a run

    metrics_path = out / "metrics.jsonl"
    before = file_stamp(metrics_path)
    cmd = [sys.executable, "-m", "titan_core.train", "--config", str(recipe)]
    result = launch_command(cmd, nproc, log_dir=out / "logs", timeout_s=timeout_s)
    # rank 0 starts by rewriting the file to the rows its run does not supersede (a fresh run: none),
    # so its current rows are this run's (after its checkpoint's, if it resumed); a file with the
    # stamp it had before is an earlier run's, left as it was by a run that never started
    rows = read_metrics(metrics_path) if file_stamp(metrics_path) not in (None, before) else []
    return WorldRun(rows, result)
