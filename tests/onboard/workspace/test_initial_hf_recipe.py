"""`new-model --weights DIR` writes `checkpoint.initial_hf` into the workspace's recipe on every path,
leaves it out (saying why in the recipe) where the recipe's model cannot load it (a twin smaller than
the checkpoint, a folder without config.json), and `onboard recipe` prints the command that continues
training the checkpoint on the user's data: a torchrun line whose titan_core arguments load.

The checkpoint is the tiny 2-shard Llama of tests/core/hf_tiny.py, with the tokenizer of tests/core/hf_data.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
from torch.distributed.run import get_args_parser

from titan_core.runtime.argv import LAUNCH

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core"))  # the tiny checkpoint and data helpers
from hf_data import doc_text, write_jsonl, write_tokenizer  # noqa: E402
from hf_tiny import write_tiny_llama  # noqa: E402
from test_cli import onboard  # noqa: E402

from onboard.sizing.twin.setup import apply_twin  # noqa: E402
from onboard.workspace.scaffold import plan_workspace, write_workspace  # noqa: E402
from titan_core.config import load_config  # noqa: E402
from titan_core.runtime.argv import parse_argv  # noqa: E402

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")
    write_tokenizer(folder)  # a model folder as the Hub ships it: weights, config.json, tokenizer.json
    return folder


def _recipe(tmp_path: Path, plan) -> Path:
    write_workspace(plan)
    return tmp_path / "onboarding" / plan.name / "recipe.toml"


@pytest.mark.parametrize("path", ["native", "port", "transformers"])
def test_weights_become_the_recipes_initial_hf_on_every_path(tmp_path, ckpt, path):
    plan = plan_workspace("m", tmp_path, hf_config=ckpt / "config.json", weights=ckpt, path=path, device="cpu")
    cfg = load_config(_recipe(tmp_path, plan))
    assert cfg.checkpoint.initial_hf == str(ckpt)
    assert cfg.model.family == ("transformers" if path == "transformers" else "llama3")


def test_without_weights_the_recipe_names_no_checkpoint(tmp_path, ckpt):
    recipe = _recipe(tmp_path, plan_workspace("m", tmp_path, hf_config=ckpt / "config.json", device="cpu"))
    assert load_config(recipe).checkpoint.initial_hf == "" and "initial_hf" not in recipe.read_text()


def test_a_twin_does_not_load_the_full_size_weights(tmp_path, ckpt):
    plan = plan_workspace("m", tmp_path, hf_config=ckpt / "config.json", weights=ckpt, device="cpu")
    apply_twin(plan, mode="on", width=32)  # the gates train a model half as wide as the checkpoint's
    assert plan.twin is not None and plan.twin["config"]["hidden_size"] == 32
    recipe = _recipe(tmp_path, plan)
    assert load_config(recipe).checkpoint.initial_hf == ""
    text = " ".join(line.lstrip("# ") for line in recipe.read_text().splitlines())
    assert "no checkpoint.initial_hf: the gates train the twin (twin.json)" in text
    assert "`onboard recipe m` prints the command" in text


def test_a_folder_without_config_json_is_named_in_the_recipe(tmp_path, ckpt):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ckpt.glob("model*.safetensors*"):
        shutil.copy(f, bare / f.name)
    recipe = _recipe(tmp_path, plan_workspace("m", tmp_path, hf_config=ckpt / "config.json", weights=bare, device="cpu"))
    assert load_config(recipe).checkpoint.initial_hf == ""
    assert f"{bare} has no config.json" in " ".join(line.lstrip("# ") for line in recipe.read_text().splitlines())


def _continue_command(tmp_path: Path, filled: dict[str, Path]):
    """`onboard recipe m --json`'s continue-training line, placeholders filled; (its titan_core argv, the view)."""
    res = onboard("recipe", "m", "--dir", tmp_path, "--json")
    assert res.exit_code == 0, res.stderr
    go = json.loads(res.stdout)["continue_training"]
    line = go["command"]
    assert set(go["fill_in"]) == {"$DATA", "$VALID_DATA", "$STEPS", "$EXPORT_DIR"}
    for name, value in filled.items():
        line = line.replace(name, str(value))
    assert "$" not in line
    argv = shlex.split(line)
    assert tuple(argv[:3]) == LAUNCH
    run = get_args_parser().parse_args(argv[3:])  # torchrun's own parser accepts it
    assert (run.module, run.training_script) == (True, "titan_core.train")
    return run.training_script_args, go


def _corpus(tmp_path: Path) -> dict[str, Path]:
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": doc_text(i)} for i in range(8)])
    held = write_jsonl(tmp_path / "held.jsonl", [{"text": doc_text(i)} for i in range(8, 12)])
    return {"$DATA": train, "$VALID_DATA": held, "$STEPS": "7", "$EXPORT_DIR": tmp_path / "export"}


def test_the_continue_training_command_loads_as_a_config(tmp_path, ckpt):
    assert onboard("new-model", "m", "--hf-config", ckpt / "config.json", "--weights", ckpt,
                   "--device", "cpu", "--dir", tmp_path).exit_code == 0  # fmt: skip
    args, go = _continue_command(tmp_path, _corpus(tmp_path))
    assert go["checkpoint"] == str(ckpt) and go["checkpoint_from"] == "the recipe's checkpoint.initial_hf"
    config, _, overrides = parse_argv(args)
    cfg = load_config(config, overrides)
    assert Path(config) == tmp_path / "onboarding" / "m" / "recipe.toml"
    assert cfg.checkpoint.initial_hf == str(ckpt) and cfg.data.tokenizer_path == str(ckpt)
    assert (cfg.data.source, cfg.data.tokenizer, cfg.data.path) == ("dataset", "hf", str(tmp_path / "train.jsonl"))
    assert cfg.validation.enable and cfg.validation.path == str(tmp_path / "held.jsonl")
    assert cfg.training.steps == 7 and cfg.checkpoint.enable and cfg.checkpoint.export_hf == str(tmp_path / "export")
    text = onboard("recipe", "m", "--dir", tmp_path).stdout
    assert "continue training the checkpoint on your data" in text and go["command"] in text


def test_a_twins_continue_command_trains_the_full_model_from_the_weights(tmp_path, ckpt):
    assert onboard("new-model", "m", "--hf-config", ckpt / "config.json", "--weights", ckpt, "--twin",
                   "--twin-width", "32", "--device", "cpu", "--dir", tmp_path).exit_code == 0  # fmt: skip
    args, go = _continue_command(tmp_path, _corpus(tmp_path))
    assert go["checkpoint"] == str(ckpt) and "--weights" in go["checkpoint_from"] and go["notes"]
    config, _, overrides = parse_argv(args)
    cfg = load_config(config, overrides)
    assert cfg.model.hf_config == str(tmp_path / "onboarding" / "m" / "config.json")  # not twin.json
    assert cfg.checkpoint.initial_hf == str(ckpt)
