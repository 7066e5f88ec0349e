"""A rank's refusal is said once and a killed rank in one line, under each launcher: `python -m
titan_core.launch` (torchrun with titan_core's checks), plain torchrun, and the local launcher of
`python -m titan_core.train --nproc N`. The ranks are _rank_behaviour.py, which imports no torch, so
each case costs torchrun's start-up only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _rank_behaviour import REFUSAL, TRACEBACK

from titan_core.launch import report
from titan_core.launcher import finish, launch_command
from titan_core.train import refuse

pytestmark = pytest.mark.whole_machine  # torchrun's ranks: the background climbs pause

WORKER = str(Path(__file__).with_name("_rank_behaviour.py"))
ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONUNBUFFERED": "1"}


def _run(launcher: list[str], mode: str, tmp_path, *options: str) -> subprocess.CompletedProcess:
    cmd = [*launcher, "--nproc-per-node=2", *options, WORKER, mode, str(tmp_path / "marker")]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120, cwd=tmp_path)


LAUNCH = [sys.executable, "-m", "titan_core.launch"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_a_refusal_of_every_rank_is_one_line_and_exit_2(tmp_path):
    done = _run(LAUNCH, "refuse-all", tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {REFUSAL}"]  # local rank 0's line; nothing of torchrun's


def test_a_refusal_of_rank_1_alone_comes_from_its_error_file(tmp_path):
    done = _run(LAUNCH, "refuse-rank1", tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {REFUSAL}"]


def test_plain_torchrun_hears_a_refusal_from_one_rank_only(tmp_path):
    """torchrun's own process still ends in its ChildFailedError traceback (exit 1): only the ranks' lines are ours."""
    done = _run(TORCHRUN, "refuse-all", tmp_path)
    assert done.returncode == 1 and "ChildFailedError" in done.stderr
    assert _errors(done.stderr) == [f"error: {REFUSAL}"]


def test_plain_torchrun_shows_a_refusal_of_rank_1_alone_in_its_own_report(tmp_path):
    """Rank 1 refused and torchrun stopped rank 0 before it could say anything: no line is ours, and the
    refusal reaches the user through the error file, in torchrun's report (its root cause's traceback)."""
    done = _run(TORCHRUN, "refuse-rank1", tmp_path)
    assert done.returncode == 1 and "ChildFailedError" in done.stderr
    assert _errors(done.stderr) == []
    said = [line.strip() for line in done.stderr.splitlines() if REFUSAL in line]
    assert said == [f"traceback : error: {REFUSAL}"], done.stderr


def test_a_killed_rank_under_titan_core_launch_is_one_line_and_exit_1(tmp_path):
    logs = tmp_path / "logs"
    done = _run(LAUNCH, "killed", tmp_path, f"--log-dir={logs}", "--redirects=3")
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()  # the ranks' output went to the files --redirects asked for
    assert line.startswith("error: rank 1 of 2 failed first (killed by SIGKILL); then rank 0 exit code 1"), line
    assert line.endswith(f"each rank's output: under {logs} (<run id>/attempt_<n>/<local rank>/)")
    (stderr_0,) = logs.glob("*/attempt_0/0/stderr.log")
    assert stderr_0.read_text().splitlines() == TRACEBACK


def test_a_killed_rank_under_the_local_launcher_is_one_line_and_exit_1(tmp_path, capfd):
    """`onboard train --nproc 2` / `python -m titan_core.train --nproc 2`: rank 0 is echoed up to its
    traceback, which stays in its log; then one line, and exit 1 (not 128 + 9)."""
    cmd = [sys.executable, WORKER, "killed", str(tmp_path / "marker")]
    result = launch_command(cmd, 2, log_dir=tmp_path / "logs", echo_rank0=True, env=ENV)
    assert result.exit_code == 128 + signal.SIGKILL and result.failed_rank == 1
    assert finish(result) == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert err[0] == "step=1 loss=5.5" and len(err) == 2, err  # the echo, then the report, and nothing between
    assert err[1].startswith("error: rank 1 of 2 was killed by SIGKILL ") and "then rank 0 exit code 1" in err[1]
    assert err[1].endswith(f"each rank's output: {tmp_path / 'logs'}/rank_<r>.log")
    assert (tmp_path / "logs" / "rank_0.log").read_text().splitlines() == ["step=1 loss=5.5", *TRACEBACK]


def test_refuse_prints_on_local_rank_0_and_writes_the_error_file_elsewhere(tmp_path, monkeypatch, capsys):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert refuse("bad input") == 2
    assert capsys.readouterr().err == ""
    assert json.loads(error_file.read_text())["message"] == "error: bad input"
    error_file.unlink()
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert refuse("bad input") == 2
    assert capsys.readouterr().err == "error: bad input\n"
    assert json.loads(error_file.read_text())["message"] == "error: bad input"  # written after the print


class _Failure:
    def __init__(self, local_rank, exitcode, message="To enable traceback see: https://pytorch.org/docs"):
        self.local_rank, self.exitcode, self.message = local_rank, exitcode, message


class _Args:
    log_dir, redirects, tee = None, "0", "0"


def test_report_of_torchruns_failures():
    said = "error: data.path 'x' does not exist"
    # local rank 0 refused: it printed its line, nothing more to say; another host's rank 0 did not print here
    assert report({0: _Failure(0, 2), 1: _Failure(1, -15)}, 0, _Args, 2) == (2, None)
    # rank 1 refused first and torchrun stopped rank 0 after its print: its error file says it refused too
    assert report({0: _Failure(0, -15, said), 1: _Failure(1, 2, said)}, 1, _Args, 2) == (2, None)
    assert report({4: _Failure(0, -15), 5: _Failure(1, 2, said)}, 5, _Args, 8) == (2, said)
    code, line = report({0: _Failure(0, 1, "RuntimeError: boom"), 1: _Failure(1, -15)}, 0, _Args, 2)
    assert code == 1 and line == ("error: rank 0 of 2 failed first (exit code 1): RuntimeError: boom; "
                                  "then rank 1 stopped; each rank's output is above")  # fmt: skip
    code, line = report({1: _Failure(1, -9, "Signal 9 (SIGKILL) received by PID 7")}, 1, _Args, None)
    assert code == 1 and line == "error: rank 1 failed first (killed by SIGKILL); each rank's output is above"
