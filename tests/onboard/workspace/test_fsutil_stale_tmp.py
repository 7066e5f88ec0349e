"""A writer killed mid-write leaves `.ladder.json.PID-XXXX.tmp`; the next writer of that path
removes it, and leaves a live writer's temp, other files' temps and other files alone."""

import os
import signal
import subprocess
import sys
import time

from hang_guard import hang_guard

from onboard.workspace.fsutil import STALE_TMP_S, atomic_write_text, remove_stale_temps


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_killed_writers_temp_is_removed_by_the_next_writer(tmp_path):
    path = tmp_path / "ladder.json"
    atomic_write_text(path, "old")
    # a writer SIGKILLed between writing its temp and the rename (fsync is the moment)
    with hang_guard(60, "a writer killed mid-write") as guard:
        killed = subprocess.run(
            [
                sys.executable,
                "-c",
                "import os, signal, sys\n"
                "from onboard.workspace.fsutil import atomic_write_text\n"
                "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
                "atomic_write_text(sys.argv[1], 'half')\n",
                str(path),
            ],
            capture_output=True,
            text=True,
            timeout=guard.timeout_s,
        )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [left] = [p.name for p in tmp_path.iterdir() if p.name != "ladder.json"]
    assert left.startswith(".ladder.json.") and left.endswith(".tmp")
    assert path.read_text() == "old"
    atomic_write_text(path, "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ladder.json"] and path.read_text() == "new"


def test_what_counts_as_stale(tmp_path):
    path = tmp_path / "ladder.json"
    path.write_text("{}")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            f".ladder.json.{dead_pid()}-abcd1234.tmp": "removed",  # its writer is gone
            f".ladder.json.{live.pid}-abcd1234.tmp": "kept",  # a live writer, mid-write
            f".ladder.json.{os.getpid()}-abcd1234.tmp": "kept",  # this process's other writer
            ".ladder.json.abcd1234.tmp": "kept",  # no pid in the name (an older onboard), still fresh
            ".ladder.json.old12345.tmp": "removed",  # no pid, and older than any live write
            f".ladder.json.{live.pid}-zzzz9999.tmp": "removed",  # a pid alive now, but far too old: reused
            f".recipe.toml.{dead_pid()}-abcd1234.tmp": "kept",  # another file's temp
            f".ladder.json.bak.{dead_pid()}-abcd1234.tmp": "kept",  # the temp of ladder.json.bak
            ".ladder.json.notes": "kept",  # not a temp at all
        }
        for name in names:
            (tmp_path / name).write_text("x")
        for name in (".ladder.json.old12345.tmp", f".ladder.json.{live.pid}-zzzz9999.tmp"):
            age(tmp_path / name, STALE_TMP_S + 5)
        removed = remove_stale_temps(path)
        assert sorted(p.name for p in removed) == sorted(n for n, fate in names.items() if fate == "removed")
        assert {n for n, fate in names.items() if fate == "kept"} | {"ladder.json"} == {
            p.name for p in tmp_path.iterdir()
        }
    finally:
        live.kill()
        live.wait()


def test_a_stale_temp_that_is_a_folder_is_left_alone(tmp_path):
    folder = tmp_path / f".ladder.json.{dead_pid()}-abcd1234.tmp"
    folder.mkdir()
    atomic_write_text(tmp_path / "ladder.json", "x")
    assert folder.is_dir()
