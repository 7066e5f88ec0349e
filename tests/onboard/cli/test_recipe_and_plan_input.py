"""Input checks on a recipe, `onboard plan` and `onboard compat --types`, and a full disk's message.

A recipe's float fields refuse NaN and infinity, and its booleans and numbers must be TOML's own
(a quoted `"false"` is refused, not read as true): one line naming the file, the field and what it
accepts, exit 2, before anything runs. `compat --types ',,,'` names nothing: exit 2, no sweep. `plan`
warns (one line, and in --json's "warnings") about a `--seq` past the config's positions, and notes
the whole-model materialisation only where it would not fit a device. A disk that fills while a
command writes its file: exit 1, one line naming the file and the free space, nothing half-written.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import stat
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from typer.testing import CliRunner

import onboard.compat
from onboard.cli.app import app
from onboard.errors import EXIT_BAD_INPUT, EXIT_FAILED, describe_os_error
from onboard.sizing.plan.planner import parse_target, plan_training
from onboard.sizing.plan.workspace import max_positions
from titan_core.config import ConfigError, JobConfig, load_config
from titan_core.memory.estimate import ModelShape, TrainSetup
from titan_core.models.common.param_counts import count_params
from titan_core.models.common.stats import flops_per_token
from titan_core.models.registry import build_meta, get_family

TINY_HF = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
}  # fmt: skip


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})


def one_line(result, code: int, *needles: str) -> str:
    """The command exited `code` and said why on one stderr line, with no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr + result.stdout, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ---- the recipe -----------------------------------------------------------------------------------------
FLOAT_FIELDS = [
    (sec.name, f.name, f.metadata.get("range"))
    for sec in dataclasses.fields(JobConfig)
    for f in dataclasses.fields(sec.default_factory())
    if f.type in (float, "float")
]


def test_every_float_field_of_a_recipe_refuses_inf_and_nan_naming_file_field_and_range(tmp_path):
    assert len(FLOAT_FIELDS) >= 10  # max_norm, lr, betas, eps, weight_decay, min_lr_ratio, timeout_s, z_loss, ...
    recipe = tmp_path / "recipe.toml"
    for section, key, accepted in FLOAT_FIELDS:
        for value in ("inf", "-inf", "nan"):
            recipe.write_text(f"[{section}]\n{key} = {value}\n")
            with pytest.raises(ConfigError) as caught:
                load_config(recipe)
            message = str(caught.value)
            assert message.startswith(f"{recipe}: {section}.{key} = {value} is out of range: it must be ")
            assert str(accepted) in message and "finite" in message and "\n" not in message
    recipe.write_text("[optimizer]\nlr = inf\n")
    assert load_config(recipe, ["--optimizer.lr=1e-3"]).optimizer.lr == 1e-3  # an override still corrects it
    with pytest.raises(ConfigError, match=r"^optimizer.lr = inf is out of range"):  # the override's own: no file
        load_config(None, ["--optimizer.lr=inf"])


def test_a_non_finite_number_inside_a_table_field_is_refused(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[model]\noverrides = {rope_scaling = {factor = nan}}\n")
    with pytest.raises(ConfigError, match=rf"^{recipe}: model.overrides = .* must be made of finite numbers$"):
        load_config(recipe)


@pytest.mark.parametrize(
    "section, line, needle",
    [
        ("compile", 'enable = "false"', "compile.enable: expected true or false, got the string 'false'"),
        ("checkpoint", 'enable = "true"', "checkpoint.enable: expected true or false, got the string 'true'"),
        ("training", 'steps = "10"', "training.steps: expected an integer, got the string '10'"),
        ("optimizer", 'lr = "inf"', "optimizer.lr: expected a number, got the string 'inf'"),
    ],
)
def test_a_quoted_boolean_or_number_in_a_recipe_is_refused(section, line, needle, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f"[{section}]\n{line}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(recipe)
    assert str(caught.value) == f"{recipe}: {needle} (write it unquoted)"


def test_overrides_stay_strings_that_the_loader_types(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[compile]\nenable = true\n")
    cfg = load_config(recipe, ["--compile.enable=false", "--training.steps=10"])
    assert cfg.compile.enable is False and cfg.training.steps == 10


@pytest.mark.parametrize(
    "body, needle",
    [
        ("[optimizer]\nlr = inf\n", "optimizer.lr = inf is out of range: it must be >= 0 (a finite number)"),
        ('[compile]\nenable = "false"\n', "compile.enable: expected true or false, got the string 'false'"),
    ],
)
def test_onboard_train_refuses_such_a_recipe_with_exit_2_before_anything_runs(body, needle, tmp_path):
    out = tmp_path / "out"
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[metrics]\noutput_dir = "{out}"\n' + body)
    line = one_line(invoke("train", "--config", recipe), EXIT_BAD_INPUT, f"{recipe}: {needle}")
    assert line.startswith("error: ")
    assert files_under(tmp_path) == {"recipe.toml"}  # no output folder, nothing else


# ---- compat --types -------------------------------------------------------------------------------------
@pytest.mark.parametrize("given", [["--types", ",,,"], ["--types", " , "], ["--types", ","]])
def test_compat_types_that_name_nothing_exit_2_and_start_no_sweep(given, tmp_path, monkeypatch):
    swept = []
    monkeypatch.setattr(onboard.compat, "sweep_to_files", lambda *a, **k: swept.append(a) or {})
    results = tmp_path / "compat.json"
    res = invoke("compat", *given, "--results", results)
    one_line(res, EXIT_BAD_INPUT, f"--types {given[1]!r}: names no model_type")
    assert swept == [] and not results.exists()
    as_json = invoke("compat", *given, "--json")
    assert as_json.exit_code == EXIT_BAD_INPUT and "names no model_type" in json.loads(as_json.stdout)["error"]
    assert swept == []


# ---- plan ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A workspace of a tiny llama (128 positions), made once; each test plans in its own copy."""
    base = tmp_path_factory.mktemp("tiny")
    (base / "config.json").write_text(json.dumps(TINY_HF))
    made = invoke("new-model", "tiny", "--hf-config", base / "config.json", "--dir", base, "--device", "cpu")
    assert made.exit_code == 0, made.stderr
    return base


@pytest.fixture
def tiny(tiny_dir, tmp_path) -> Path:
    shutil.copytree(tiny_dir / "onboarding", tmp_path / "onboarding")
    return tmp_path


def test_plan_warns_once_about_a_seq_past_max_position_embeddings_and_writes_no_false_note(tiny):
    root = tiny / "onboarding" / "tiny"
    res = invoke("plan", "tiny", "--dir", tiny, "--target", "h100:8", "--seq", "100000", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert len(out["warnings"]) == 1
    assert "--seq 100000 exceeds config.json's max_position_embeddings (128)" in out["warnings"][0]
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")] == [f"warning: {out['warnings'][0]}"]
    assert (root / f"recipe.h100-8.seq{out['seq_len']}.toml").is_file()
    # a model of a few hundred KiB fits every rank whole: no note may say it cannot
    assert not any("survive" in n or "materialise" in n for n in out["notes"]), out["notes"]
    text = invoke("plan", "tiny", "--dir", tiny, "--target", "h100:8", "--seq", "100000")
    assert text.exit_code == 0
    assert [ln for ln in text.stderr.splitlines() if ln.startswith("warning:")] == [f"warning: {out['warnings'][0]}"]
    assert "survive" not in text.stdout and "Traceback" not in text.stderr
    fine = invoke("plan", "tiny", "--dir", tiny, "--target", "h100:8", "--seq", "128", "--json")
    assert fine.exit_code == 0 and json.loads(fine.stdout)["warnings"] == [] and "warning" not in fine.stderr


@pytest.mark.parametrize(
    "config, limit",
    [
        ({"n_positions": 1024}, (1024, "config.json's n_positions")),
        ({"text_config": {"max_position_embeddings": 8192}}, (8192, "config.json's text_config."
                                                                     "max_position_embeddings")),  # fmt: skip
        ({"max_position_embeddings": None}, None),
    ],
)
def test_the_positions_limit_is_found_under_the_names_configs_give_it(config, limit, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", **config}))
    ws = SimpleNamespace(hf_config_path=tmp_path / "config.json")
    assert max_positions(ws, args=None) == limit


def _plan(flavor: str, target: str):
    args = get_family("llama3").flavors[flavor]
    meta = build_meta("llama3", args)
    return plan_training(
        ModelShape.from_model(meta, args), count_params(meta), lambda s: flops_per_token(args, s),
        parse_target(target), seq_len=256, kernels=TrainSetup(batch_size=1, seq_len=1), tp_plan=True,
    )  # fmt: skip


def test_a_70b_plan_materialises_shards_not_the_whole_model():
    """titan_core builds every rank's shards on meta and initialises them one parameter at a time, so the
    plan's materialise moment is this rank's shards and one whole parameter, not 70B fp32 weights (~280 GB)."""
    plan = _plan("70B", "h100:64")
    assert not any("materialise" in n for n in plan.notes)
    args = get_family("llama3").flavors["70B"]
    whole = ModelShape.from_model(build_meta("llama3", args), args).params * 4
    assert plan.chosen.estimate.materialise < whole / 16, plan.chosen.estimate


# ---- a full disk ---------------------------------------------------------------------------------------
Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("named", [False, True], ids=["write-names-no-file", "write-names-the-file"])
def test_a_full_disk_while_plan_writes_its_recipe_is_one_line_naming_the_file_and_free_space(
    named, tiny, monkeypatch
):
    root = tiny / "onboarding" / "tiny"
    before = files_under(tiny)
    real_fsync, asked = os.fsync, []

    def full(fd):  # the disk fills as the recipe's bytes reach it (a folder's fsync stays real)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.ENOSPC, "No space left on device", *([str(root / "x.toml")] if named else []))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: asked.append(Path(p)) or Usage(2**40, 2**40, 3 * 2**29))
    res = invoke("plan", "tiny", "--dir", tiny, "--target", "h100:8", "--seq", "128")
    path = root / "x.toml" if named else root / "recipe.h100-8.seq128.toml"
    line = one_line(res, EXIT_FAILED, f"error: {path}: No space left on device (ENOSPC)")
    assert line.endswith(f"(1.50 GiB free on the filesystem of {root})") and asked == [root]
    assert files_under(tiny) == before  # no recipe, no temp file


def test_describe_os_error_gives_the_free_space_of_the_nearest_existing_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1, 1, 512))
    for code in (errno.ENOSPC, errno.EDQUOT):
        exit_code, line = describe_os_error(OSError(code, os.strerror(code), str(tmp_path / "a" / "b" / "f.json")))
        assert exit_code == EXIT_FAILED and line.endswith(f"(512 B free on the filesystem of {tmp_path})")
    assert "free on" not in describe_os_error(OSError(errno.EIO, "I/O error", str(tmp_path)))[1]
