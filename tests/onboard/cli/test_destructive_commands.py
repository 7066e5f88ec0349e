"""Nothing a person made is destroyed: each command that would replace a file or folder of theirs
refuses without --force (exit 2, one line naming it; every byte left where it was), and with
--force moves it to `<name>.backup-<time>` beside it first and says where (text and --json).

The four commands found replacing data: `new-model --force` (deleted the old workspace),
`demo` (replaced an earlier demo's workspace unasked), `compat --results F` without --resume
(rewrote a table of hours), `plan` (rewrote a hand-edited recipe.<target>.toml). Each is
exercised only up to its replacement decision: the demo's climb and the compat probes are
stubbed, plan runs on the meta device."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.workspace.fsutil import BACKUP_INFIX, backup_aside
from onboard.workspace.scaffold import plan_workspace, write_workspace

runner = CliRunner()
PORTER = b"# the porter's work\n"


def tree(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `root` (one file: {"": sha256})."""
    if root.is_file():
        return {"": hashlib.sha256(root.read_bytes()).hexdigest()}
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def refused(result, *needles: str) -> str:
    """The refusal's one line: exit 2, one line on stderr holding each needle."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.stderr, result.stdout)
    for needle in ("--force", "backup", *needles):
        assert needle in lines[0], lines[0]
    return lines[0]


def workspace(base: Path, name: str, preset: str = "llama3/debugmodel") -> Path:
    """A workspace with a person's work in it: an edited adapter.py and a file of their own."""
    root = write_workspace(plan_workspace(name, base, preset=preset, device="cpu"))
    (root / "adapter.py").write_bytes(PORTER)
    (root / "runs").mkdir()
    (root / "runs" / "notes.txt").write_bytes(b"what I learned\n")
    return root


# ---- the helper ------------------------------------------------------------------------------
def test_backup_aside_moves_and_never_takes_a_name_twice(tmp_path):
    f = tmp_path / "table.json"
    f.write_bytes(b"189 rows")
    inode = f.stat().st_ino
    first = backup_aside(f)
    assert not f.exists() and first.parent == tmp_path and first.name.startswith(f"table.json{BACKUP_INFIX}")
    assert first.read_bytes() == b"189 rows" and first.stat().st_ino == inode  # renamed, not copied
    f.write_bytes(b"second")
    second = backup_aside(f)  # the same second, most likely: the name gets -2, the first stays
    assert second != first and first.read_bytes() == b"189 rows" and second.read_bytes() == b"second"
    d = tmp_path / "old"
    d.mkdir()
    (d / "x").write_bytes(b"x")
    kept = backup_aside(d, named_for=tmp_path / "m")
    assert kept.name.startswith(f"m{BACKUP_INFIX}") and (kept / "x").read_bytes() == b"x" and not d.exists()


# ---- new-model --force -----------------------------------------------------------------------
def test_new_model_refuses_then_force_keeps_the_old_workspace_whole(tmp_path):
    root = workspace(tmp_path, "m")
    before = tree(tmp_path)
    old = tree(root)
    line = refused(runner.invoke(app, ["new-model", "m", "--preset", "qwen3", "--dir", str(tmp_path)]), str(root))
    assert "m.backup-" in line
    assert tree(tmp_path) == before
    forced = runner.invoke(app, ["new-model", "m", "--preset", "qwen3", "--dir", str(tmp_path), "--force", "--json"])
    assert forced.exit_code == 0, forced.stderr
    backup = Path(json.loads(forced.stdout)["backup"])
    assert backup.parent == root.parent and backup.name.startswith(f"m{BACKUP_INFIX}")
    assert tree(backup) == old  # ledger, edited adapter, the person's own files: byte for byte
    assert (root / "adapter.py").read_bytes() != PORTER
    listed = runner.invoke(app, ["list", "--dir", str(tmp_path), "--json"])
    assert [w["workspace"] for w in json.loads(listed.stdout)["workspaces"]] == ["m"]  # a backup is no workspace
    text = runner.invoke(app, ["new-model", "m", "--preset", "llama3", "--dir", str(tmp_path), "--force"])
    assert text.exit_code == 0 and "kept as" in text.stdout
    assert len(list(root.parent.glob(f"m{BACKUP_INFIX}*"))) == 2  # the first backup is still there


# ---- demo --------------------------------------------------------------------------------------
@pytest.fixture
def quick_demo(monkeypatch):
    """The demo up to its ladder: the climb and the train stage stubbed (the stage writes its folder)."""
    from onboard.cli import demo, demo_train

    def stage(ws, base, out):
        folder = Path(base) / demo_train.FOLDER
        folder.mkdir()
        (folder / "train.jsonl").write_text("{}\n")
        return {"exit_code": 0}

    monkeypatch.setattr(demo, "_ladder", lambda base, name, source, out, t0, timing: {"exit_code": 0})
    monkeypatch.setattr(demo_train, "run_train_stage", stage)
    return demo_train.FOLDER


def test_demo_refuses_an_earlier_demo_then_force_keeps_it(tmp_path, quick_demo):
    root = workspace(tmp_path, "llama3_debug")
    stage = tmp_path / quick_demo
    stage.mkdir()
    (stage / "exported").mkdir()
    (stage / "exported" / "model.safetensors").write_bytes(b"weights")
    before, old_ws, old_stage = tree(tmp_path), tree(root), tree(stage)
    refused(runner.invoke(app, ["demo", "--dir", str(tmp_path)]), str(root))
    assert tree(tmp_path) == before
    forced = runner.invoke(app, ["demo", "--dir", str(tmp_path), "--force", "--json"])
    assert forced.exit_code == 0, forced.stderr
    out = json.loads(forced.stdout)
    assert tree(Path(out["backup"])) == old_ws and Path(out["backup"]).parent == root.parent
    assert tree(Path(out["train"]["backup"])) == old_stage and Path(out["train"]["backup"]).parent == tmp_path
    assert (root / "adapter.py").read_bytes() != PORTER and (stage / "train.jsonl").is_file()


def test_demo_refuses_an_earlier_train_stage_alone_and_a_rerun_keeps_the_first(tmp_path, quick_demo):
    stage = tmp_path / quick_demo
    stage.mkdir()
    (stage / "train.log").write_bytes(b"an earlier run\n")
    before, old_stage = tree(tmp_path), tree(stage)
    refused(runner.invoke(app, ["demo", "--dir", str(tmp_path)]), str(stage))
    assert tree(tmp_path) == before
    # --no-train leaves the stage's folder alone: nothing of it is replaced, nothing refused
    assert runner.invoke(app, ["demo", "--dir", str(tmp_path), "--no-train"]).exit_code == 0
    assert tree(stage) == old_stage
    # `make demo` twice: --force each time, each earlier run kept
    for _ in range(2):
        again = runner.invoke(app, ["demo", "--dir", str(tmp_path), "--force"])
        assert again.exit_code == 0, again.stderr
        assert "the earlier demo workspace is kept as" in again.stdout
    assert len(list((tmp_path / "onboarding").glob(f"llama3_debug{BACKUP_INFIX}*"))) == 2
    assert len(list(tmp_path.glob(f"{quick_demo}{BACKUP_INFIX}*"))) == 2


# ---- compat --results --------------------------------------------------------------------------
@pytest.fixture
def quick_sweep(monkeypatch):
    """compat without probes: every model_type 'not probed' (the table the real sweep builds), the
    earlier row kept where --resume gave one."""
    pytest.importorskip("transformers", reason="needs the [hf] extra; make install has it, so CI runs this")
    sweep = importlib.import_module("onboard.compat.sweep")  # the package exports a function of that name

    def fake(model_types, *, timeout, log, previous, on_row, jobs):
        kept = (previous or {}).get("not_probed", {})
        table = sweep.table(model_types, {}, {mt: kept.get(mt, "stubbed") for mt in model_types})
        on_row(table)
        return table

    monkeypatch.setattr(sweep, "sweep", fake)
    return sweep


def test_compat_refuses_a_results_table_without_resume_then_force_keeps_it(tmp_path, quick_sweep):
    results, md = tmp_path / "compat.json", tmp_path / "COMPAT.md"
    results.write_text(json.dumps({"rows": {f"type{i}": {} for i in range(189)}, "not_probed": {}}))
    md.write_bytes(b"# my table\n")
    table = results.read_bytes()
    before = tree(tmp_path)
    args = ["compat", "--types", "llama", "--results", str(results)]
    line = refused(runner.invoke(app, args), str(results), "--resume")
    assert "189 model_types" in line
    refused(runner.invoke(app, ["compat", "llama", "--markdown", str(md)]), str(md))
    assert tree(tmp_path) == before
    forced = runner.invoke(app, [*args, "--markdown", str(md), "--force", "--json"])
    assert forced.exit_code == 0, forced.stderr
    out = json.loads(forced.stdout)
    assert Path(out["backup"]).read_bytes() == table and Path(out["backup"]).parent == tmp_path
    assert Path(out["markdown_backup"]).read_bytes() == b"# my table\n"
    assert json.loads(results.read_text()) == out and list(out["not_probed"]) == ["llama"]
    text = runner.invoke(app, [*args, "--force"])  # the text output says where too
    [second] = set(tmp_path.glob(f"compat.json{BACKUP_INFIX}*")) - {Path(out["backup"])}
    assert text.exit_code == 0 and f"kept as {second}" in text.stdout


def test_compat_resume_that_would_drop_rows_needs_force(tmp_path, quick_sweep):
    results = tmp_path / "compat.json"
    full = quick_sweep.table(["llama", "gpt2"], {}, {"llama": "earlier", "gpt2": "earlier"})
    results.write_text(json.dumps(full))
    before = tree(tmp_path)
    line = refused(runner.invoke(app, ["compat", "llama", "--results", str(results), "--resume"]), str(results))
    assert "gpt2" in line and "drop" in line
    assert tree(tmp_path) == before
    # naming every type it holds goes on from it, no --force, no backup
    kept = runner.invoke(app, ["compat", "llama", "gpt2", "--results", str(results), "--resume", "--json"])
    assert kept.exit_code == 0, kept.stderr
    assert json.loads(kept.stdout)["backup"] is None and json.loads(results.read_text())["not_probed"] == {
        "llama": "earlier",
        "gpt2": "earlier",
    }
    assert not list(tmp_path.glob(f"*{BACKUP_INFIX}*"))


# ---- plan --------------------------------------------------------------------------------------
def test_plan_rewrites_its_own_recipe_but_not_a_hand_edited_one(tmp_path):
    write_workspace(plan_workspace("p", tmp_path, preset="llama3/debugmodel", device="cpu"))
    args = ["plan", "p", "--dir", str(tmp_path), "--target", "h100:8", "--seq", "256", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.stderr
    recipe = Path(json.loads(first.stdout)["recipe"])
    again = runner.invoke(app, args)  # as plan wrote it: rewritten, no --force, no backup
    assert again.exit_code == 0 and json.loads(again.stdout)["backup"] is None, again.stderr
    recipe.write_bytes(recipe.read_bytes().replace(b"batch_size = ", b"batch_size = 1  # mine\n#", 1))
    edited, before = recipe.read_bytes(), tree(tmp_path)
    refused(runner.invoke(app, args[:-1]), str(recipe), "edited")
    assert tree(tmp_path) == before
    forced = runner.invoke(app, [*args, "--force"])
    assert forced.exit_code == 0, forced.stderr
    backup = Path(json.loads(forced.stdout)["backup"])
    assert backup.parent == recipe.parent and backup.read_bytes() == edited
    assert b"# mine" not in recipe.read_bytes()
    text = runner.invoke(app, args[:-1])  # plan's own file again: no --force needed
    assert text.exit_code == 0 and "kept as" not in text.stdout
    assert list(recipe.parent.glob(f"*{BACKUP_INFIX}*")) == [backup]
    recipe.write_bytes(recipe.read_bytes() + b"# mine again\n")
    edited = recipe.read_bytes()
    text = runner.invoke(app, [*args[:-1], "--force"])  # the text output says where
    [second] = set(recipe.parent.glob(f"*{BACKUP_INFIX}*")) - {backup}
    assert text.exit_code == 0 and f"kept as {second}" in text.stdout and second.read_bytes() == edited
