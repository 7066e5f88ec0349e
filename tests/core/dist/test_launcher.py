"""The launcher: `run_world` (a rung's entry) on a clean run; `python -m titan_core.train --nproc N`
(what `onboard train --nproc N` calls) with a rank that raises and a rank that hangs, in bounded time."""

from __future__ import annotations

import sys
import time

import pytest
from _cases import RUN_STEPS, max_rel, overrides
from tiny_flags import tiny_run_flags
from hang_guard import HangGuard

from titan_core.config import load_config
from titan_core.launcher import EXIT_TIMEOUT, launch_command, run_world
from titan_core.train import main

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause


def tiny(out, steps: int) -> list[str]:
    return [overrides("llama3"), *tiny_run_flags(out, steps=steps, batch_size=2)]


FAULTY = '''
import os, time
from titan_core.models.llama3.model import Llama3


class Faulty(Llama3):
    """Rank 1 misbehaves in its second loss call (step 2)."""

    calls = 0

    def loss(self, tokens, labels, **kw):
        Faulty.calls += 1
        if os.environ["RANK"] == "1" and Faulty.calls == 2:
            if {mode!r} == "raise":
                raise RuntimeError("injected failure on rank 1")
            time.sleep(300)  # a stuck rank: the others wait in their next collective
        return super().loss(tokens, labels, **kw)


def build_model(args):
    return Faulty(args)
'''


def _faulty(tmp_path, mode):
    path = tmp_path / f"faulty_{mode}.py"
    path.write_text(FAULTY.format(mode=mode))
    return path


def test_run_world_trains_on_two_processes(tmp_path, reference):
    """The entry a ladder rung uses: N processes, rank 0's metrics back."""
    cfg = load_config(None, tiny(tmp_path, RUN_STEPS))
    guard = HangGuard("run_world on 2 ranks", 240)
    world = run_world(cfg, 2, timeout_s=guard.timeout_s)
    guard.fail_if(world.launch.exit_code == EXIT_TIMEOUT, world.launch.failure)
    assert world.ok, world.launch.failure
    assert [r["step"] for r in world.metrics] == list(range(1, RUN_STEPS + 1))
    want = reference("llama3", dp=2)  # batch 2 per rank = the reference's 4 rows
    assert max_rel([r["loss"] for r in world.metrics], want["loss"]) <= 1e-6
    assert max_rel([r["grad_norm"] for r in world.metrics], want["grad_norm"]) <= 1e-6
    assert (tmp_path / "logs" / "rank_0.log").is_file() and (tmp_path / "logs" / "rank_1.log").is_file()
    # the ranks were torchrun's: the command that ran is the `torchrun ... -m titan_core.train` a user runs
    command = world.launch.command
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"] and "--nproc-per-node=2" in command
    assert command[-4:] == ["-m", "titan_core.train", "--config", str(tmp_path / "world_recipe.toml")]


def test_a_rank_that_raises_is_named_with_its_output(tmp_path, capfd):
    t0 = time.monotonic()
    code = main(["--nproc", "2", *tiny(tmp_path, 4), f"--model.module_file={_faulty(tmp_path, 'raise')}"])
    elapsed = time.monotonic() - t0
    err = capfd.readouterr().err
    assert code == 1
    report = err[err.index("error: rank") :]
    assert report.startswith("error: rank 1 of 2 failed first (exit code 1")
    # the exception comes first, then the tail of rank 1's own output, which holds it too
    assert report.splitlines()[0].endswith("s after start): RuntimeError: injected failure on rank 1; the last lines of its output:")
    assert report.count("RuntimeError: injected failure on rank 1") == 2
    assert "step=1" in err[: err.index("error: rank")]  # rank 0's own output was echoed as it ran
    assert (tmp_path / "logs" / "rank_1.log").read_text().count("injected failure") >= 1
    assert elapsed < 90


def test_a_hung_rank_ends_in_a_collective_timeout(tmp_path, capfd):
    t0 = time.monotonic()
    code = main(["--nproc", "2", *tiny(tmp_path, 4), f"--model.module_file={_faulty(tmp_path, 'hang')}",
                 "--parallelism.timeout_s=4"])  # fmt: skip
    elapsed = time.monotonic() - t0
    err = capfd.readouterr().err
    assert code == 1
    report = err[err.index("error: rank") :]
    # rank 0 waited in a collective for rank 1, timed out after 4 s, and rank 1 (asleep) was stopped
    assert report.startswith("error: rank 0 of 2 failed first")
    assert "Timed out" in report
    assert "so stopped: rank(s) 1" in report
    assert elapsed < 90


def test_launch_command_names_the_failing_rank_and_its_exit_code(tmp_path):
    # rank 1 fails only once rank 0 has printed (its marker file): torchrun stops the other ranks at
    # once when one fails, so on a loaded machine rank 0 could otherwise be stopped before its print
    marker = tmp_path / "rank0_said_hello"
    script = (
        "import os, sys, time, pathlib; r = os.environ['RANK']; m = pathlib.Path(sys.argv[1]); print('hello from', r)\n"
        "if r == '0': m.touch(); time.sleep(30)\n"
        "t = time.monotonic()\n"
        "while not m.exists() and time.monotonic() - t < 60: time.sleep(0.02)\n"
        "sys.exit(3)"
    )
    result = launch_command([sys.executable, "-c", script, str(marker)], 2, log_dir=tmp_path)
    assert result.exit_code == 3 and result.failed_rank == 1
    assert result.failure.startswith("error: rank 1 of 2 failed first (exit code 3")
    assert "  | hello from 1" in result.failure and "hello from 0" not in result.failure
    assert "after start); the last lines" in result.failure  # no exception in its tail: none named
    assert (tmp_path / "rank_0.log").read_text() == "hello from 0\n"


def test_launch_command_timeout_stops_every_rank(tmp_path):
    """The timeout stops the world and reports it with rank 0's last lines. The ranks must have printed before it
    fires, and torchrun takes seconds to start them: first 6 s, enough on a machine that is not busy; only where
    they had not printed by then (a loaded machine), once more at the hang guard's 6 s stretched for the load."""
    for timeout_s in (6, round(HangGuard("torchrun starting 2 ranks", 6).timeout_s)):
        t0 = time.monotonic()
        result = launch_command(
            [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"], 2, timeout_s=timeout_s
        )
        assert result.exit_code == EXIT_TIMEOUT
        assert f"did not finish within {timeout_s} s" in result.failure
        assert time.monotonic() - t0 < timeout_s + 15
        if "  | started" in result.failure:
            break
    assert "  | started" in result.failure


SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
x FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-01-01_00:00:01
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 12)  (SIGTERM)
  traceback : Signal 15 (SIGTERM) received by PID 12
[2]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 10)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:01
  rank      : 1 (local_rank: 1)
  exitcode  : 7 (pid: 11)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""


def test_torchrun_s_summary_gives_the_root_cause_first_then_the_other_failures():
    from titan_core.launcher import torchrun_failures

    assert torchrun_failures("W1206 some agent line\n" + SUMMARY) == [(1, 7), (2, -15), (0, 1)]
    assert torchrun_failures("usage: torchrun [-h] ...\nerror: unrecognized arguments") == []


def test_the_exception_line_is_the_last_that_names_one_without_the_rank_prefix():
    from titan_core.launcher import exception_line

    tail = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
            "[rank0]: torch.distributed.DistBackendError: first", "[rank0]:   during handling",
            "[rank0]: RuntimeError: expected m1 and m2 to have the same dtype"]  # fmt: skip
    assert exception_line(tail) == "RuntimeError: expected m1 and m2 to have the same dtype"
    assert exception_line(["KeyboardInterrupt"]) == "KeyboardInterrupt"
    assert exception_line(["hello from 1", "ValueErrors are common: not a traceback line"]) is None
