"""Ctrl-C and SIGTERM end a command as interrupted, never as a failed gate: exit 130 / 143, the
attempt recorded `interrupted`, the child processes stopped and the command's temp folders removed.

The multi-process cases run next-step in a forked child process whose rung goes through simple_fsdp's
own launch path (`_world` -> `launcher.run_world` -> `launch_command`: torchrun), with ranks that sleep
instead of training, so a signal lands while two rank processes run, in seconds."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import typer
from hang_guard import HangGuard, hang_guard
from processes import alive, pids_running

from onboard.cli.app import app
from onboard.cli.shared import run_command
from onboard.ladder.gates import parse_checklist
from onboard.ladder.table import RUNGS, RungSpec
from onboard.engine import next_step as engine
from onboard.engine.next_step import next_step
from onboard.errors import EXIT_INTERRUPTED, Interrupted
from onboard.workspace.layout import Workspace
from onboard.rungs import simple_fsdp_rung
from onboard.workspace.scaffold import plan_workspace, write_workspace
from titan_core import launcher
from titan_core.launcher import launch_command

LINUX_ONLY = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="finds the rank and probe processes through /proc, which only Linux has (never skipped in CI: Linux)",
)

CHECKLIST = {
    "rung": "eager",
    "criteria": [{"name": "ran", "metric": "score", "comparator": ">=", "threshold": 1.0, "hint": "did not run"}],
}

RANK = (
    "import os, sys, time, pathlib; d = pathlib.Path(sys.argv[1]); t = d / ('.' + os.environ['RANK']); "
    "t.write_text(str(os.getpid())); os.replace(t, d / os.environ['RANK']); time.sleep(120)"
)
"""A rank that writes its pid into the folder it is given (under a temporary name, renamed: a file the
test sees is whole) and sleeps until it is stopped."""
FORK = multiprocessing.get_context("fork")
# JAX, imported by other tests of the session, warns at every fork that its threads could deadlock a child
# that calls into it; the forked children here never do, and run torch with one thread (no OpenMP region)
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")


def _onboard_child(argv: list[str], out: Path, setup=None, *, session: bool = False) -> None:
    """`onboard ARGV` in a forked child (never returns), with Python's own SIGINT handler and the default
    SIGTERM, as a fresh interpreter has them whatever this suite's process was given; `session`: in a
    session of its own (a SIGINT to its process group reaches it and its children as a terminal's Ctrl-C
    does); stdout and stderr into `out`; `setup()` first. It exits with the command's exit code, as the
    interpreter would. Forked, not started: a process as real (its own pid, signals and exit status)
    without a fresh interpreter importing onboard, titan_core and torch again (~4 s of CPU a child)."""
    code = 1
    try:
        torch.set_num_threads(1)  # a forked child enters no OpenMP parallel region
        if session:
            os.setsid()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        if setup is not None:
            setup()
        app(argv, prog_name="onboard")
        code = 0
    except SystemExit as e:  # the command's own exit
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush(), sys.stderr.flush()
        finally:
            os._exit(code)


def _sleeping_ranks(pids: Path) -> None:
    """In the child, before next-step: its eager rung goes through simple_fsdp's launch path (`_world` ->
    `launcher.run_world` -> `launch_command`), run_world's ranks sleeping instead of training (this
    process's own modules patched: the suite's are untouched)."""

    def sleeping_world(cfg, nproc, *, timeout_s=None):
        cmd = [sys.executable, "-c", RANK, str(pids)]
        return launcher.WorldRun([], launcher.launch_command(cmd, nproc, timeout_s=timeout_s))

    class ShardedRung:
        def run(self, ctx):
            cfg = SimpleNamespace(metrics=SimpleNamespace(output_dir=str(ctx.attempt_dir)))
            simple_fsdp_rung._world(ctx, cfg, 2, "sleeping ranks", required=True)
            raise AssertionError("the ranks sleep until they are stopped")

    checklist = parse_checklist(json.loads(json.dumps(CHECKLIST)), "fake")
    launcher.run_world = sleeping_world
    engine.default_specs = lambda: [RungSpec("eager", None, module=ShardedRung(), checklist=checklist)] + [
        RungSpec(r, None) for r in RUNGS[1:]]  # fmt: skip


def _temp_folder(tmp: Path) -> None:
    """In the child: its temp folders (and its children's) under `tmp`."""
    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None  # read TMPDIR again


@pytest.fixture
def ws(tmp_path) -> Workspace:
    write_workspace(plan_workspace("m", tmp_path, preset="llama3/debugmodel", device="cpu"))
    return Workspace.load(tmp_path, "m")


def attempts(ws: Workspace) -> list[dict]:
    return json.loads((ws.root / "ladder.json").read_text())["attempts"]


def wait_for(pred, what: str, base_s: float = 60):
    guard = HangGuard(f"waiting for {what}", base_s)
    deadline = time.monotonic() + guard.timeout_s
    while not (value := pred()):
        if time.monotonic() > deadline:
            pytest.fail(guard.message())
        time.sleep(0.05)
    return value


def rank_pids(folder: Path) -> list[int] | None:
    """The pids both RANKs wrote into `folder`; None until both did."""
    got = list(folder.glob("[!.]*"))
    return [int(p.read_text()) for p in got] if len(got) == 2 else None


@LINUX_ONLY
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_multi_process_rung_is_an_interruption_not_a_failure(ws, tmp_path, sig, code):
    pids, out = tmp_path / "pids", tmp_path / "out"
    pids.mkdir(), out.mkdir()
    argv, setup = ["next-step", "m", "--dir", str(tmp_path), "--json"], partial(_sleeping_ranks, pids)
    proc = FORK.Process(target=_onboard_child, args=(argv, out, setup), kwargs={"session": True})
    proc.start()
    try:
        ranks = wait_for(lambda: rank_pids(pids), "both ranks to start")
        assert all(alive(p) for p in ranks)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # the child's session: next-step, torchrun and the ranks
        else:
            os.kill(proc.pid, sig)  # a SIGTERM to next-step alone
        with hang_guard(30, "next-step after the signal") as guard:
            proc.join(timeout=guard.timeout_s)
            guard.fail_if(proc.is_alive(), (out / "stderr").read_text()[-2000:])
    finally:
        if proc.is_alive():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.join()
    err = (out / "stderr").read_text()
    assert proc.exitcode == code, err[-3000:]
    name = signal.Signals(sig).name
    shown = json.loads((out / "stdout").read_text())
    assert (shown["status"], shown["exit_code"]) == ("interrupted", code)
    [entry] = attempts(ws)  # one entry, interrupted: no gate result, nothing failed
    assert entry["status"] == "interrupted" and entry["ended"], entry
    assert entry["error"].startswith(f"interrupted by {name}") and not entry["criteria"], entry
    # the launcher stopped (and reaped) its ranks before next-step exited: none outlives it
    assert [p for p in ranks if alive(p)] == []


@LINUX_ONLY
def test_the_launcher_stops_its_ranks_and_hands_a_ctrl_c_on_to_its_caller(tmp_path):
    """Not a LaunchResult with a nonzero code, which the rung would read as a failed run."""
    started = []

    def ctrl_c_once_both_run():
        started.extend(wait_for(lambda: rank_pids(tmp_path), "both ranks to start"))
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender = threading.Thread(target=ctrl_c_once_both_run, daemon=True)
    try:
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            launch_command([sys.executable, "-c", RANK, str(tmp_path)], 2, timeout_s=120)
    finally:
        signal.signal(signal.SIGINT, before)
        sender.join(timeout=5)
    assert len(started) == 2 and [p for p in started if alive(p)] == []


class SwallowingRung:
    """A rung that takes a signal for a failure of its own, as a rung whose child process the same
    Ctrl-C stopped does: it catches the interrupt and raises an ordinary error."""

    def __init__(self, sig):
        self.sig = sig

    def run(self, ctx):
        try:
            signal.raise_signal(self.sig)  # its handler runs before this returns
        except BaseException:
            pass
        raise RuntimeError("a child process exited 130")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_rung_that_takes_the_signal_for_a_failure_is_still_recorded_interrupted(ws, sig, code):
    checklist = parse_checklist(json.loads(json.dumps(CHECKLIST)), "fake eager")
    specs = [RungSpec("eager", None, module=SwallowingRung(sig), checklist=checklist)]
    specs += [RungSpec(r, None) for r in RUNGS[1:]]
    # Python's own Ctrl-C handler and the default SIGTERM, whatever the session left installed
    before = signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        outcome = next_step(ws, specs=specs)
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
    assert (outcome.status, outcome.exit_code) == ("interrupted", code)
    [entry] = attempts(ws)
    name = signal.Signals(sig).name
    assert entry["status"] == "interrupted", entry
    assert entry["error"] == f"interrupted by {name} (the rung ended on it as RuntimeError: a child process exited 130)"


def test_the_command_boundary_exits_128_plus_the_signal(capsys):
    def terminated(out):
        raise Interrupted(signal.SIGTERM)

    def took_it(out):  # a body that handles the interrupt itself (compat: the finished rows, exit 130)
        try:
            signal.raise_signal(signal.SIGTERM)
        except Interrupted:
            return EXIT_INTERRUPTED
        return 0

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        codes = []
        for body, json_mode in ((terminated, True), (took_it, False), (lambda out: EXIT_INTERRUPTED, False)):
            with pytest.raises(typer.Exit) as ended:
                run_command(json_mode, body)
            codes.append(ended.value.exit_code)
    finally:
        signal.signal(signal.SIGTERM, before)
    # a body's own 130 stays 130 when no SIGTERM came (a Ctrl-C it took)
    assert codes == [143, 143, 130]
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"error": "interrupted by SIGTERM", "exit_code": 143, "signal": "SIGTERM"}
    assert captured.err.splitlines() == ["interrupted by SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the command's only


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_onboard_train_ends_interrupted_on_either_signal(tmp_path, monkeypatch, sig, code):
    """`onboard train` runs titan_core's trainer in its own process: a signal mid-run unwinds it (its
    `finally`s run) and the command says so and exits 128 + the signal, not 1 and not a traceback."""
    import titan_core.train
    from typer.testing import CliRunner

    from onboard.cli.app import app

    unwound = []

    def training(argv):
        try:
            signal.raise_signal(sig)
            time.sleep(30)  # never reached: the handler raises
        finally:
            unwound.append(True)
        return 0

    monkeypatch.setattr(titan_core.train, "main", training)
    recipe = tmp_path / "r.toml"
    recipe.write_text("[model]\nfamily = 'llama3'\nflavor = 'debugmodel'\n")
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL), signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = CliRunner().invoke(app, ["train", "--config", str(recipe)])
    finally:
        signal.signal(signal.SIGTERM, before[0]), signal.signal(signal.SIGINT, before[1])
    assert result.exit_code == code, result.output
    assert unwound == [True]
    assert result.stderr.splitlines()[-1] == f"interrupted by {signal.Signals(sig).name}"


@pytest.mark.hf
@LINUX_ONLY
def test_sigterm_during_compat_removes_its_temp_folder_and_stops_the_probe(tmp_path):
    tmp, out = tmp_path / "tmp", tmp_path / "out"
    tmp.mkdir(), out.mkdir()
    proc = FORK.Process(target=_onboard_child, args=(["compat", "llama", "--json"], out, partial(_temp_folder, tmp)))
    proc.start()
    try:
        # the probe's command line names its results file in the sweep's temp folder
        probes = wait_for(lambda: list(tmp.glob("onboard-compat-*")) and pids_running(str(tmp)), "the probe to start")
        os.kill(proc.pid, signal.SIGTERM)
        with hang_guard(30, "onboard compat after SIGTERM") as guard:
            proc.join(timeout=guard.timeout_s)
            guard.fail_if(proc.is_alive(), (out / "stderr").read_text()[-2000:])
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert proc.exitcode == 143, (out / "stderr").read_text()[-3000:]
    assert json.loads((out / "stdout").read_text())["interrupted"] == "llama"
    assert list(tmp.glob("onboard-compat-*")) == []
    assert [p for p in probes if alive(p)] == []
