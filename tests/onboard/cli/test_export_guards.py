"""`onboard export` keeps what it is given and ships what it says (issue 45): a target inside (or
holding) onboarding/ is refused, the untrained initial_hf weights only with --from-initial, the
tokenizer always (the recipe's or --tokenizer's; a missing one refuses, a byte tokenizer is said),
files with the mode a plain write gives, and a full disk is one line, exit 1, nothing left behind.

On a narrowed llama3 debug workspace trained for 2 steps once per module (`onboard train NAME`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.cli.export_cmd import check_target
from onboard.errors import BadInput
from onboard.workspace.scaffold import plan_workspace, write_workspace

import safetensors.torch as safetensors_torch
NARROW = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=128, vocab_size=256)  # fmt: skip


def onboard(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})


def make_ws(base: Path, name: str = "dbg", recipe_tail: str = "") -> Path:
    """A llama3 debug workspace with a narrow config.json; returns its folder."""
    root = write_workspace(plan_workspace(name, base, preset="llama3/debugmodel", device="cpu"))
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, **NARROW}))
    (root / "recipe.toml").write_text((root / "recipe.toml").read_text() + recipe_tail)
    return root


def write_tokenizer(folder: Path) -> Path:
    """A WordLevel tokenizer.json and its tokenizer_config.json (BOS/EOS), as save_pretrained leaves them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", "hello", "world"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A project folder whose workspace `dbg` holds a 2-step checkpoint; tests copy it before changing it."""
    base = tmp_path_factory.mktemp("trained")
    make_ws(base)
    result = onboard("train", "dbg", "--steps", 2, "--dir", base, "--training.batch_size=1", "--training.seq_len=16",
                     "--checkpoint.enable", "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["steps_run"] == 2
    return base


@pytest.fixture
def project(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "p")
    return tmp_path / "p"


def error_line(result, code: int, *needles: str) -> str:
    """The last stderr line, the only error line, carries every needle; exit `code`."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# ---- 1. never into onboarding/ ------------------------------------------------------------------
@pytest.mark.parametrize("where", ["onboarding/dbg", "onboarding/other", "onboarding", ".", "link"])
def test_a_target_inside_or_holding_onboarding_is_refused_even_with_force(project, where):
    os.symlink(project / "onboarding" / "dbg" / "runs", project / "link")  # a way in that does not say so
    before = sorted(p.name for p in (project / "onboarding").iterdir())
    result = onboard("export", "dbg", "--to", project / where, "--dir", project, "--force")
    error_line(result, 2, "the workspaces' folder")
    assert sorted(p.name for p in (project / "onboarding").iterdir()) == before  # no workspace moved aside
    assert not list(project.glob("*.backup-*")) and not list(project.glob(".*partial"))
    listed = onboard("list", "--dir", project, "--json")
    assert "dbg" in listed.stdout


def test_a_workspace_linked_from_elsewhere_is_kept_too(tmp_path):
    """onboarding/dbg a link to a folder elsewhere: that folder is the workspace as much as the link."""
    real = tmp_path / "elsewhere" / "dbg"
    real.mkdir(parents=True)
    (tmp_path / "onboarding").mkdir()
    os.symlink(real, tmp_path / "onboarding" / "dbg")
    for to in (real, real / "out", tmp_path / "elsewhere"):
        with pytest.raises(BadInput, match="the workspace's folder"):
            check_target(to, tmp_path / "onboarding", (tmp_path / "onboarding" / "dbg").resolve())
    check_target(tmp_path / "elsewhere" / "out", tmp_path / "onboarding", real)  # beside it: fine


# ---- 2. the tokenizer, always -------------------------------------------------------------------
def test_a_byte_tokenizer_recipe_says_no_tokenizer_was_written(project):
    result = onboard("export", "dbg", "--to", project / "out", "--dir", project)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].endswith(": config.json, model.safetensors")
    assert lines[1].startswith('no tokenizer written: the recipe\'s data.tokenizer is "byte"')
    assert "--tokenizer" in lines[1] and len(lines) == 2


def test_the_recipes_hf_tokenizer_travels_and_a_missing_one_refuses(project):
    write_tokenizer(project / "tok")
    recipe = project / "onboarding" / "dbg" / "recipe.toml"
    recipe.write_text(recipe.read_text().replace('source = "synthetic"', 'source = "synthetic"\ntokenizer = "hf"\n'
                                                 f'tokenizer_path = "{project / "tok"}"'))  # fmt: skip
    result = onboard("export", "dbg", "--to", project / "out", "--dir", project, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokenizer"] == ["tokenizer.json", "tokenizer_config.json"]
    assert report["files"] == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert (project / "out" / "tokenizer.json").read_bytes() == (project / "tok" / "tokenizer.json").read_bytes()
    shutil.rmtree(project / "tok")
    missing = onboard("export", "dbg", "--to", project / "out2", "--dir", project)
    error_line(missing, 2, "the tokenizer is missing", str(project / "tok"), "data.tokenizer_path")
    assert not (project / "out2").exists()


def test_tokenizer_option_names_the_runs_tokenizer(project):
    write_tokenizer(project / "tok")
    result = onboard("export", "dbg", "--to", project / "out", "--dir", project, "--tokenizer", project / "tok")
    assert result.exit_code == 0, result.stderr
    assert f"tokenizer from --tokenizer {project / 'tok'}: tokenizer.json, tokenizer_config.json" in result.stdout
    assert (project / "out" / "tokenizer_config.json").is_file()
    gone = onboard("export", "dbg", "--to", project / "out2", "--dir", project, "--tokenizer", project / "none")
    error_line(gone, 2, "--tokenizer", "does not exist")


# ---- 3. untrained weights only when asked -------------------------------------------------------
def test_untrained_initial_weights_only_with_from_initial(project, tmp_path):
    first = onboard("export", "dbg", "--to", project / "trained_export", "--dir", project)
    assert first.exit_code == 0, first.stderr
    # a second workspace of the same model, never trained, whose initial_hf is that export
    fresh = tmp_path / "fresh"
    make_ws(fresh, recipe_tail=f'\n[checkpoint]\ninitial_hf = "{project / "trained_export"}"\n')
    refused = onboard("export", "dbg", "--to", fresh / "out", "--dir", fresh)
    error_line(refused, 2, "no checkpoint to export", "--from CHECKPOINT", "--from-initial", "onboard train dbg")
    assert not (fresh / "out").exists()
    both = onboard("export", "dbg", "--to", fresh / "out", "--dir", fresh, "--from-initial", "--from", fresh)
    error_line(both, 2, "--from and --from-initial")
    result = onboard("export", "dbg", "--to", fresh / "out", "--dir", fresh, "--from-initial", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["from"].endswith("(untrained)")
    got = safetensors_torch.load_file(fresh / "out" / "model.safetensors")
    want = safetensors_torch.load_file(project / "trained_export" / "model.safetensors")
    assert sorted(got) == sorted(want) and all(got[k].equal(want[k]) for k in want)
    make_ws(tmp_path / "none")
    no_initial = onboard("export", "dbg", "--to", tmp_path / "out", "--dir", tmp_path / "none", "--from-initial")
    error_line(no_initial, 2, "--from-initial", "names no checkpoint.initial_hf")


# ---- 4. modes -----------------------------------------------------------------------------------
def test_exported_files_get_a_plain_writes_mode(project):
    write_tokenizer(project / "tok")
    old = os.umask(0o022)
    try:
        result = onboard("export", "dbg", "--to", project / "out", "--dir", project, "--tokenizer", project / "tok")
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in (project / "out").iterdir()}
    names = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert modes == dict.fromkeys(names, 0o644)
    assert (project / "out").stat().st_mode & 0o777 == 0o755


# ---- 5. a full disk -----------------------------------------------------------------------------
def _safetensors_full(*args, **kwargs):
    from safetensors import SafetensorError

    # what safetensors 0.8 raises when the disk fills under save_file (measured on a 64 KiB tmpfs)
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def _os_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no file named


@pytest.mark.parametrize("save", [_safetensors_full, _os_full], ids=["SafetensorError", "OSError"])
def test_a_full_disk_is_one_line_exit_1_and_leaves_nothing(project, monkeypatch, save):
    (project / "out").mkdir()
    (project / "out" / "keep.txt").write_text("the old export")
    monkeypatch.setattr(safetensors_torch, "save_file", save)
    result = onboard("export", "dbg", "--to", project / "out", "--dir", project, "--force")
    line = error_line(result, 1, f"{project / 'out'}: No space left on device (ENOSPC)", "free on the filesystem")
    assert ".partial" not in line
    assert sorted(p.name for p in project.iterdir() if p.name.startswith((".out", "out"))) == ["out"]
    assert [p.name for p in (project / "out").iterdir()] == ["keep.txt"]  # the old folder as it was, no backup
    as_json = onboard("export", "dbg", "--to", project / "new", "--dir", project, "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["errno"] == "ENOSPC"
    assert not (project / "new").exists() and not (project / ".new.partial").exists()
