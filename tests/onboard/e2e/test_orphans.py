"""kill -9 of the process that started them ends rank processes and the parity pytest child:
nothing outlives a killed launcher or next-step, and nothing writes into a closed attempt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hang_guard import HangGuard, hang_guard
from processes import alive, pids_running, state

from titan_core.runtime.die_with_parent import EXIT_PARENT_GONE, main as wrapper_main, supported

pytestmark = pytest.mark.skipif(not supported(), reason="PR_SET_PDEATHSIG is Linux-only")
ONBOARD = Path(sys.executable).parent / "onboard"


def wait_for(pred, timeout: float, what: str, *, guard: bool = False):
    """pred()'s first true value within `timeout` s. guard=True: `timeout` is a hang guard's base
    (scaled by the load, which the failure states); else it is the bound the test asserts."""
    hang = HangGuard(f"waiting for {what}", timeout) if guard else None
    deadline = time.monotonic() + (hang.timeout_s if hang else timeout)
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.05)
    pytest.fail(hang.message() if hang else f"timed out waiting for {what}")


def test_ranks_die_within_seconds_of_a_killed_launcher(tmp_path):
    # each rank writes its pid under a temporary name and renames it: a file the test sees is whole
    rank = (
        "import os, time, pathlib; d = pathlib.Path(os.environ['PIDS']); t = d / ('.' + os.environ['RANK']); "
        "t.write_text(str(os.getpid())); os.replace(t, d / os.environ['RANK']); time.sleep(120)"
    )
    driver = textwrap.dedent(f"""
        import sys
        from titan_core.launcher import launch_command
        launch_command([sys.executable, "-c", {rank!r}], 2, timeout_s=300)
    """)
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", driver], env={**os.environ, "PIDS": str(pids)})
    ranks = wait_for(
        lambda: len(whole := list(pids.glob("[!.]*"))) == 2 and [int(p.read_text()) for p in whole],
        60,
        "both ranks to start",
        guard=True,
    )
    assert all(alive(p) for p in ranks)
    proc.send_signal(signal.SIGKILL)
    with hang_guard(10, "the killed launcher to be reaped") as hang:
        proc.wait(timeout=hang.timeout_s)
    t0 = time.monotonic()
    wait_for(lambda: not any(alive(p) for p in ranks), 5, f"ranks {ranks} to die after the launcher was killed")
    assert time.monotonic() - t0 < 5


def test_a_background_climb_dies_with_a_session_killed_outright():
    """tests/background.py: a session ended by SIGKILL (or a timeout's SIGTERM) runs no sessionfinish,
    and its climb must not live on to load the machine (one outlived a `timeout 120 pytest` by minutes)."""
    tests = Path(__file__).resolve().parents[2]
    driver = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(tests)!r})
        import background
        sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
        background.JOBS["sleeper"] = background.Job("none", "a sleeper", lambda base, shared: sleeper, 60)
        print(background.start("sleeper", shared=True).proc.pid, flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    climb = int(proc.stdout.readline())
    assert alive(climb)
    proc.send_signal(signal.SIGKILL)
    with hang_guard(10, "the killed session to be reaped") as hang:
        proc.wait(timeout=hang.timeout_s)
    wait_for(lambda: not alive(climb), 5, f"the climb (pid {climb}) to die with its session")


def test_pausing_a_climb_stops_every_process_of_it_and_resuming_continues_them(tmp_path):
    """tests/background.py's pause for a whole_machine test: the climb and a child in a session of its own
    (as the launcher starts ranks) stop together and continue together. Only this test's own climb is
    touched: the session's real climbs run in the same module."""
    import background

    rank = "import os, time; os.setsid(); time.sleep(120)"
    child_pid = tmp_path / "child"
    climb = (
        "import subprocess, sys, time, pathlib; "
        f"p = subprocess.Popen([sys.executable, '-c', {rank!r}]); "
        f"pathlib.Path({str(child_pid)!r}).write_text(str(p.pid)); time.sleep(120)"
    )
    background.JOBS["sleeper"] = background.Job("none", "a sleeper", lambda base, shared: [sys.executable, "-c", climb], 60)
    run = background.start("sleeper", shared=False)
    try:
        child = wait_for(lambda: child_pid.exists() and child_pid.read_text() and int(child_pid.read_text()), 30,
                         "the climb's child to start", guard=True)  # fmt: skip
        background.pause(run)  # a signal is taken when its process next runs: within moments
        wait_for(lambda: (state(run.proc.pid), state(child)) == ("T", "T"), 5, "both to stop")
        background.resume(run)
        wait_for(lambda: "T" not in (state(run.proc.pid), state(child)), 5, "both to continue")
        assert run.paused_s > 0 and alive(child)
        # nothing with a lock is shared with the suite: a paused climb's lock would stop it
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{child}/environ").read_text().split("\0") if "=" in kv)
        for name in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR"):
            assert Path(env[name]).is_relative_to(run.base), name
    finally:
        background._stop(run)
        background._runs.pop("sleeper", None)
        background.JOBS.pop("sleeper", None)
        if child_pid.exists() and child_pid.read_text():
            os.kill(int(child_pid.read_text()), signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_does_not_start(tmp_path):
    # the wrapper is told a parent that is not its parent: it must not run the command
    marker = tmp_path / "ran"
    code = wrapper_main(["1", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    assert code == EXIT_PARENT_GONE and not marker.exists()


def test_wrapper_refuses_a_malformed_command_line(capsys):
    assert wrapper_main(["notapid", "--", "true"]) == 2
    assert wrapper_main(["1", "--signal=SIGNOPE", "--", "true"]) == 2  # a signal the kernel has no name for
    assert capsys.readouterr().err.count("usage") == 2


@pytest.mark.slow
@pytest.mark.hf
def test_kill_9_of_next_step_ends_the_parity_pytest_child(narrow_ws, tmp_path):
    ws = narrow_ws("llama3")
    base = [str(ONBOARD), "next-step", ws.name, "--dir", str(tmp_path), "--json"]
    with hang_guard(300, "next-step (eager)") as hang:
        eager = subprocess.run(base, capture_output=True, text=True, timeout=hang.timeout_s)
    assert eager.returncode == 0, eager.stderr
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    test_file = str(ws.root / "test_parity.py")
    children = wait_for(lambda: pids_running(test_file), 120, "the parity pytest child to start", guard=True)
    proc.send_signal(signal.SIGKILL)
    with hang_guard(10, "the killed next-step to be reaped") as hang:
        proc.wait(timeout=hang.timeout_s)
    wait_for(lambda: not any(alive(p) for p in children), 5, f"pytest child {children} to die with next-step")
    attempt = ws.root / "runs" / "parity" / "attempt-1"
    assert not (attempt / "results.json").exists()
