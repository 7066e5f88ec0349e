"""Workspace names, file hashing, the atomic ledger and the lock."""

import json
import os

import pytest

from onboard.errors import BadInput
from onboard.workspace.fsutil import atomic_write_text, sha256_file
from onboard.workspace.ledger import Ledger
from onboard.workspace.lock import WorkspaceLock, holder
from onboard.workspace.layout import Workspace, validate_name


@pytest.mark.parametrize("name", ["llama3_debug", "m", "_x", "Qwen2_5"])
def test_identifier_names_are_accepted(name):
    validate_name(name)


@pytest.mark.parametrize("name", ["a/b", "..", "a..b", "a b", "a-b", "ü", "3x", "", "a\\b", "x.y"])
def test_other_names_are_rejected(name):
    with pytest.raises(BadInput):
        validate_name(name)


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "ladder.json"
    atomic_write_text(path, "old")

    def fail(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", fail)  # interrupted after writing, before the rename
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ladder.json"]  # no temp file left


def test_ledger_round_trip_and_strict_json(tmp_path):
    ledger = Ledger.new(tmp_path / "ladder.json", {"name": "x"})
    ledger.append({"rung": "eager", "attempt": 1, "status": "failed", "measurements": {"loss": float("nan")}})
    ledger.save()
    text = (tmp_path / "ladder.json").read_text()
    assert "NaN" not in text  # strict JSON: non-finite floats are stored as their repr
    assert json.loads(text)["attempts"][0]["measurements"]["loss"] == "nan"
    again = Ledger.load(tmp_path / "ladder.json")
    assert again.next_attempt("eager") == 2 and again.next_attempt("parity") == 1


@pytest.mark.parametrize(
    "text, needle",
    [
        ("{oops", "not valid JSON"),
        ('{"format": 1}', "no 'attempts' list"),
        ('{"format": 9, "attempts": []}', "format 9"),
    ],
)
def test_ledger_load_rejects_broken_files(tmp_path, text, needle):
    (tmp_path / "ladder.json").write_text(text)
    with pytest.raises(BadInput, match=needle):
        Ledger.load(tmp_path / "ladder.json")


def test_waivers_latest_wins(tmp_path):
    ledger = Ledger.new(tmp_path / "l.json", {})
    ledger.add_waiver("eager", "loss_falls", "first")
    ledger.add_waiver("eager", "loss_falls", "second")
    ledger.add_waiver("parity", "seq_len", "other")
    assert ledger.waivers("eager")[("eager", "loss_falls")]["why"] == "second"
    assert len(ledger.waivers()) == 2 and len(ledger.data["waivers"]) == 3  # history kept


def test_hashes_and_changes(tmp_path):
    root = tmp_path / "onboarding" / "w"
    root.mkdir(parents=True)
    Ledger.new(root / "ladder.json", {}).save()
    (root / "recipe.toml").write_text("a = 1\n")
    outside = tmp_path / "weights.bin"
    outside.write_bytes(b"w")
    ws = Workspace.load(tmp_path, "w")
    hashes = ws.hashes([root / "recipe.toml", outside])
    assert hashes == {"recipe.toml": sha256_file(root / "recipe.toml"), str(outside.resolve()): sha256_file(outside)}
    assert ws.changed_files(hashes) == []
    outside.write_bytes(b"W")
    (root / "recipe.toml").unlink()
    assert sorted(ws.changed_files(hashes)) == sorted(["recipe.toml", str(outside.resolve())])


def test_lock_is_exclusive_and_reports_its_holder(tmp_path):
    with WorkspaceLock(tmp_path) as lock:
        assert holder(tmp_path) == os.getpid() and lock.took_over is None
        with pytest.raises(BadInput, match=f"pid {os.getpid()}"):
            WorkspaceLock(tmp_path).acquire()
    assert holder(tmp_path) is None and not (tmp_path / ".onboard.lock").exists()
