"""A next-step process terminated or killed mid-rung leaves ladder.json valid, the attempt
recorded as interrupted, and a lock the next run takes over."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import HangGuard, hang_guard
from ladder_fakes import specs

from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.workspace.ledger import parse_iso
from onboard.workspace.layout import Workspace

HERE = Path(__file__).parent


def start_sleeping_rung(ws, tmp_path):
    """Run ladder_fakes.py (next-step with a 60 s eager rung) and wait until the rung is running."""
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ladder_fakes.py"), str(ws.root.parent.parent), ws.name, str(ready)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    guard = HangGuard("the fake rung starting", 60)
    deadline = time.monotonic() + guard.timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"fake rung never started: {proc.communicate()}\n{guard.message()}")
        time.sleep(0.05)
    return proc


def entries(ws):
    return json.loads((ws.root / "ladder.json").read_text())["attempts"]  # json.loads: the file must be valid


def test_sigterm_mid_rung_records_interrupted_and_exits_143(debug_ws, tmp_path):
    proc = start_sleeping_rung(debug_ws, tmp_path)
    [placeholder] = entries(debug_ws)  # written before the rung started
    assert placeholder["status"] == "interrupted" and placeholder["ended"] is None
    running = {s.rung: s for s in ladder_states(Workspace.load(tmp_path, "dbg"), specs())}["eager"]
    assert running.status == "running" and str(proc.pid) in running.reason
    proc.send_signal(signal.SIGTERM)
    with hang_guard(30, "next-step after SIGTERM") as guard:
        out, err = proc.communicate(timeout=guard.timeout_s)
    assert proc.returncode == 143, err  # 128 + SIGTERM
    assert out.strip() == "interrupted"
    [entry] = entries(debug_ws)
    assert entry["status"] == "interrupted" and "Interrupted" in entry["error"]
    assert parse_iso(entry["started"]) <= parse_iso(entry["ended"])  # the end was recorded, after the start
    assert not (debug_ws.root / ".onboard.lock").exists()


def test_sigkill_mid_rung_leaves_valid_ledger_and_a_lock_the_next_run_takes_over(debug_ws, tmp_path):
    proc = start_sleeping_rung(debug_ws, tmp_path)
    proc.kill()
    with hang_guard(30, "next-step after SIGKILL") as guard:
        proc.communicate(timeout=guard.timeout_s)
    [entry] = entries(debug_ws)
    assert entry["status"] == "interrupted" and entry["ended"] is None
    lock = debug_ws.root / ".onboard.lock"
    assert json.loads(lock.read_text())["pid"] == proc.pid  # the dead run's lock is still on disk
    ws = Workspace.load(tmp_path, "dbg")
    assert {s.rung: s.status for s in ladder_states(ws, specs())}["eager"] == "interrupted"
    lines = []
    outcome = next_step(ws, specs=specs(), log=lines.append)
    assert any(f"took over the lock left by pid {proc.pid}" in line for line in lines)
    assert (outcome.rung, outcome.attempt, outcome.status) == ("eager", 2, "passed")
    assert [e["status"] for e in entries(debug_ws)] == ["interrupted", "passed"]


def test_lock_file_of_a_dead_pid_is_taken_over(debug_ws):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (debug_ws.root / ".onboard.lock").write_text(json.dumps({"pid": dead.pid, "host": "here"}))
    lines = []
    outcome = next_step(debug_ws, specs=specs(), log=lines.append)
    assert outcome.status == "passed"
    assert lines[0] == f"took over the lock left by pid {dead.pid} (no longer running)"


def test_a_lock_held_by_a_live_process_is_refused_with_its_pid(debug_ws, tmp_path):
    code = (
        "import sys, time; from onboard.workspace.lock import WorkspaceLock\n"
        "with WorkspaceLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(debug_ws.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with hang_guard(60, "next-step against a held lock") as guard:
            result = subprocess.run(
                [sys.executable, "-m", "onboard", "next-step", "dbg", "--dir", str(tmp_path)],
                capture_output=True,
                text=True,
                timeout=guard.timeout_s,
            )
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"error: another onboard run (pid {holder.pid}) holds {debug_ws.root / '.onboard.lock'}; "
            "wait for it to finish (or stop it) and run again"
        ]
    finally:
        holder.kill()
        holder.wait()
    assert entries(debug_ws) == []
