"""Long names are refused before anything is made; `new-model --force` keeps the workspace
findable at every instant and the replaced one as NAME.backup-<time>: a crash between any two
steps of the swap is recovered by the next command, with one line saying what it did, and temp
folders and backups are never listed."""

import multiprocessing
import os
import signal
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch
from hang_guard import HangGuard
from typer.testing import CliRunner

from onboard.workspace import scaffold
from onboard.cli.app import app
from onboard.errors import BadInput
from onboard.workspace.ledger import Ledger
from onboard.workspace.lock import WorkspaceLock, holder
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.workspace.fsutil import BACKUP_INFIX
from onboard.workspace.layout import LEDGER, MAX_NAME, Workspace, list_workspaces, name_lock, validate_name

runner = CliRunner()
OLD_MARK = "# the porter's work\n"
FORK = multiprocessing.get_context("fork")
# JAX, imported by other tests of the session, warns at every fork that its threads could deadlock a child
# that calls into it; the forked children here never do, and run torch with one thread (no OpenMP region)
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")


def _child(plan, instant: str, force: bool, signals: Path) -> None:
    """In a forked child: replace workspace m with `plan` and die (os._exit: no cleanup runs, as in a
    kill) at one instant of the swap, chosen by patching the step after it; never returns. Forked, not
    started: the process is as real (its own pid, its own flocks, its death the kernel sees) without a
    fresh interpreter importing onboard and torch again (~2 s of CPU a child)."""
    code = 1
    try:
        torch.set_num_threads(1)  # a forked child enters no OpenMP parallel region
        real_rename, renames = os.rename, []

        def die():
            os._exit(9)

        def rename(src, dst):
            if instant == "built" or (instant == "aside" and renames) or (instant == "swapped" and len(renames) == 2):
                die()
            real_rename(src, dst)
            renames.append(dst)
            if instant == "held_aside":  # stay between the two renames until killed or told to go on
                (signals / "ready").write_text("")
                while not (signals / "go").exists():
                    time.sleep(0.01)

        def save(self):
            die()

        os.rename = rename  # this process's own os module: the parent's is untouched
        if instant == "building":
            scaffold.Ledger.save = save
        scaffold.write_workspace(plan, force=force)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def make(tmp_path, preset="llama3", force=False, name="m"):
    plan = plan_workspace(name, tmp_path, preset=preset, force=force)
    return write_workspace(plan, force=force)


def entries(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "onboarding").iterdir())


def backups(tmp_path, name="m") -> list[Path]:
    return sorted((tmp_path / "onboarding").glob(f"{name}{BACKUP_INFIX}*"))


def family_of(root: Path) -> str:
    return Ledger.load(root / LEDGER).meta["family"]


def crash(tmp_path, instant, *, force=True, wait=True):
    """Fork the child for `instant`; returns its Process (already finished when `wait`)."""
    plan = plan_workspace("m", tmp_path, preset="qwen3", force=force)
    child = FORK.Process(target=_child, args=(plan, instant, force, tmp_path))
    child.start()
    if wait:
        assert join(child, 60, f"the child crashing at {instant}") == 9
    return child


def join(child, base_s: float, what: str) -> int:
    """The forked child's exit code (-N: killed by signal N); one that outlives the hang guard is killed
    and fails the test with the load."""
    guard = HangGuard(what, base_s)
    child.join(timeout=guard.timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        guard.fail()
    return child.exitcode


@pytest.fixture
def old_ws(tmp_path):
    root = make(tmp_path)
    (root / "adapter.py").write_text(OLD_MARK)
    return root


# ---- names ---------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [250, 300])
def test_long_names_are_refused_before_anything_is_made(tmp_path, length):
    result = runner.invoke(app, ["new-model", "m" * length, "--preset", "llama3", "--dir", str(tmp_path), "--json"])
    assert result.exit_code == 2, result.stdout
    assert f"NAME is {length} characters long; at most {MAX_NAME}" in result.stderr
    assert list(tmp_path.iterdir()) == []  # not even onboarding/


def test_the_longest_name_allowed_fits_every_path_of_a_forced_replace(tmp_path):
    name = "n" * MAX_NAME
    validate_name(name)
    with pytest.raises(BadInput, match="at most"):
        validate_name(name + "n")
    make(tmp_path, name=name)
    make(tmp_path, preset="qwen3", force=True, name=name)
    [kept] = backups(tmp_path, name)
    assert entries(tmp_path) == [name, kept.name] and family_of(tmp_path / "onboarding" / name) == "qwen3"
    assert family_of(kept) == "llama3"


# ---- listing -------------------------------------------------------------------------------
def test_temp_folders_are_never_listed(tmp_path, old_ws):
    # a live new-model (its per-name lock held) is building m's replacement: not listed, not touched
    tmp = tmp_path / "onboarding" / ".m.new-abc123"
    tmp.mkdir()
    (tmp / LEDGER).write_text((old_ws / LEDGER).read_text())
    with name_lock(tmp_path / "onboarding", "m"):
        assert [p.name for p in list_workspaces(tmp_path)] == ["m"]
        assert tmp.is_dir()
    result = runner.invoke(app, ["list", "--dir", str(tmp_path), "--json"])
    assert result.exit_code == 0 and '".m.new-' not in result.stdout
    assert entries(tmp_path) == ["m"]  # its builder gone, the next command removed it


# ---- a crash at each instant of the swap -----------------------------------------------------
@pytest.mark.parametrize(
    "instant, survivor, said",
    [
        ("building", "llama3", "removed .m.new-"),  # new one half written
        ("built", "llama3", "removed .m.new-"),  # new one complete, old one untouched
        ("aside", "llama3", "restored the workspace"),  # old one moved aside, new one not in yet
        ("swapped", "qwen3", "kept the workspace `new-model --force` replaced as m.backup-"),  # old one not kept yet
    ],
)
def test_a_crash_at_each_instant_is_recovered_by_the_next_status(tmp_path, old_ws, capsys, instant, survivor, said):
    crash(tmp_path, instant)
    leftovers = [n for n in entries(tmp_path) if n.startswith(".m.")]
    assert leftovers, entries(tmp_path)  # the crash did leave something to recover
    capsys.readouterr()
    ws = Workspace.load(tmp_path, "m")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("onboard: workspace m: ") and said in err[0], err
    kept = backups(tmp_path)
    assert family_of(ws.root) == survivor and entries(tmp_path) == ["m", *(p.name for p in kept)]
    assert ((ws.root / "adapter.py").read_text() == OLD_MARK) == (survivor == "llama3")
    # a replaced workspace is never removed: after the commit point the old one is the backup
    assert [(p / "adapter.py").read_text() for p in kept] == ([OLD_MARK] if survivor == "qwen3" else [])
    assert [p.name for p in list_workspaces(tmp_path)] == ["m"]
    assert holder(ws.root) is None  # a lock file the dead swapper left names no live run


@pytest.mark.parametrize("command", ["list", "new-model", "status"])
def test_between_the_renames_every_command_finds_the_old_workspace(tmp_path, old_ws, command):
    crash(tmp_path, "aside")
    assert "m" not in entries(tmp_path)  # the instant the issue describes
    argv = {
        "list": ["list"],
        "new-model": ["new-model", "m", "--preset", "qwen3"],  # no --force: the restored one is in the way
        "status": ["status", "m"],
    }[command]
    result = runner.invoke(app, [*argv, "--dir", str(tmp_path), "--json"])
    assert "restored the workspace" in result.stderr
    assert result.exit_code == (2 if command == "new-model" else 0), result.stderr
    assert ".m." not in result.stdout and entries(tmp_path) == ["m"]
    assert (tmp_path / "onboarding" / "m" / "adapter.py").read_text() == OLD_MARK


def test_a_first_new_model_that_finished_building_is_moved_in(tmp_path, capsys):
    crash(tmp_path, "built", force=False)
    assert [n for n in entries(tmp_path) if not n.endswith(".lock")][0].startswith(".m.new-")
    assert [p.name for p in list_workspaces(tmp_path)] == ["m"]
    assert "moved in the workspace" in capsys.readouterr().err
    assert family_of(tmp_path / "onboarding" / "m") == "qwen3"


def test_a_workspace_an_earlier_onboard_moved_aside_is_restored(tmp_path, old_ws):
    # the layout of the earlier swap: the old workspace one level down in .m.old-X/m
    aside = tmp_path / "onboarding" / ".m.old-x1"
    aside.mkdir()
    old_ws.rename(aside / "m")
    ws = Workspace.load(tmp_path, "m")
    assert (ws.root / "adapter.py").read_text() == OLD_MARK and entries(tmp_path) == ["m"]


# ---- a real SIGKILL, and a live swap waited out ----------------------------------------------
def _held_aside(tmp_path):
    child = crash(tmp_path, "held_aside", wait=False)
    ready = tmp_path / "ready"
    guard = HangGuard("the child holding the old workspace aside", 60)
    deadline = time.monotonic() + guard.timeout_s
    while not ready.exists():
        assert child.is_alive(), f"the child exited {child.exitcode} before holding the workspace aside"
        assert time.monotonic() < deadline, guard.message()
        time.sleep(0.01)
    assert "m" not in entries(tmp_path)
    return child


def test_sigkill_between_the_renames_is_recovered(tmp_path, old_ws, capsys):
    child = _held_aside(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    assert join(child, 30, "the killed child to be reaped") == -signal.SIGKILL
    ws = Workspace.load(tmp_path, "m")
    assert (ws.root / "adapter.py").read_text() == OLD_MARK and entries(tmp_path) == ["m"]
    assert "restored the workspace" in capsys.readouterr().err


def test_a_status_during_a_live_swap_waits_for_it_and_finds_the_new_one(tmp_path, old_ws):
    child = _held_aside(tmp_path)
    go = threading.Timer(0.3, (tmp_path / "go").write_text, args=("",))
    go.start()
    start = time.monotonic()
    ws = Workspace.load(tmp_path, "m")  # NAME is missing right now: it waits for the swap's lock
    assert time.monotonic() - start >= 0.25
    assert join(child, 30, "the swap to finish") == 0
    [kept] = backups(tmp_path)
    assert family_of(ws.root) == "qwen3" and entries(tmp_path) == ["m", kept.name]
    assert (kept / "adapter.py").read_text() == OLD_MARK


# ---- an error (not a crash) between the renames ----------------------------------------------
def test_a_failing_second_rename_puts_the_old_workspace_back(tmp_path, old_ws, monkeypatch):
    plan = plan_workspace("m", tmp_path, preset="qwen3", force=True)
    real, calls = os.rename, []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # new -> m
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(scaffold.os, "rename", rename)
    with pytest.raises(OSError, match="No space"):
        write_workspace(plan, force=True)
    assert entries(tmp_path) == ["m"] and (old_ws / "adapter.py").read_text() == OLD_MARK
    assert not (old_ws / ".onboard.lock").exists()


def test_force_is_refused_while_a_run_holds_the_old_workspace(tmp_path, old_ws):
    plan = plan_workspace("m", tmp_path, preset="qwen3", force=True)
    with WorkspaceLock(old_ws):
        with pytest.raises(BadInput, match="another onboard run"):
            write_workspace(plan, force=True)
    assert entries(tmp_path) == ["m"] and family_of(old_ws) == "llama3"
