"""README's "Train your model" section says only what the code does: its TOML snippets and its
`--section.key=value` overrides load through titan_core's config loader, the options of its `onboard`
commands exist, its TensorBoard and checkpoint paths are where the recipe puts them, and the whole
loop it shows (train from a checkpoint on JSONL data with validation, export, reload in
transformers) runs on a tiny 2-shard Llama, so the docs cannot drift from the code.

The placeholders (DIR, data/*.jsonl, /abs/path/exported, step-1000) are replaced by real tiny paths.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core"))  # the tiny checkpoint and data helpers
from hf_data import conversation, doc_text, write_jsonl, write_tokenizer  # noqa: E402
from hf_tiny import write_tiny_llama  # noqa: E402
from tiny_flags import tiny_run_flags  # noqa: E402

from onboard.cli.app import app  # noqa: E402
from titan_core.config.loader import get_key, load_config  # noqa: E402
from titan_core.measure.metrics import TENSORBOARD_DIR, read_metrics  # noqa: E402
from titan_core.runtime.argv import parse_argv  # noqa: E402
from titan_core.training.hf_export import INDEX  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.slow]

README = Path(__file__).resolve().parents[3] / "README.md"
TITLE = "## Train your model"
NAME = "mymodel"
RECIPE = f"onboarding/{NAME}/recipe.toml"
OUTPUT = f"onboarding/{NAME}/runs/train"
"""The workspace recipe's metrics.output_dir (templates/recipe.toml.j2), relative to the current directory."""


def section() -> str:
    text = README.read_text()
    assert text.count(TITLE) == 1, f"README.md has no single '{TITLE}' section"
    return text.split(TITLE, 1)[1].split("\n## ", 1)[0]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), re.S)


def command_lines() -> list[list[str]]:
    """Every shell command of the section's bash blocks, continuation lines joined."""
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip():
                out.append(shlex.split(line))
    return out


def train_argv(words: list[str]) -> list[str]:
    """The titan_core.train arguments of a torchrun line (`torchrun [opts] -m titan_core.train ARGS`)."""
    assert words[0] == "torchrun" and "-m" in words, words
    i = words.index("-m")
    assert words[i + 1] == "titan_core.train", words
    return words[i + 2 :]


@pytest.fixture
def where(tmp_path, monkeypatch) -> dict[str, Path]:
    """A workspace `mymodel` scaffolded from a tiny 2-shard Llama (its tokenizer beside its weights),
    JSONL train / held-out / chat files; the current directory is their folder, as README's commands assume."""
    ckpt = write_tiny_llama(tmp_path / "model")
    write_tokenizer(ckpt)
    monkeypatch.chdir(tmp_path)
    made = CliRunner().invoke(app, ["new-model", NAME, "--hf-config", str(ckpt / "config.json"), "--device", "cpu",
                                    "--dir", str(tmp_path), "--path", "native"])  # fmt: skip
    assert made.exit_code == 0, made.output
    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", [{"text": doc_text(i)} for i in range(48)])
    write_jsonl(data / "val.jsonl", [{"text": doc_text(i)} for i in range(100, 116)])
    write_jsonl(data / "chats.jsonl", [conversation(i) for i in range(16)])
    write_jsonl(data / "chats_val.jsonl", [conversation(i) for i in range(20, 28)])
    return {"DIR": ckpt, "/abs/path/exported": tmp_path / "exported", "root": tmp_path}


def fill(word: str, where: dict[str, Path]) -> str:
    for placeholder in ("DIR", "/abs/path/exported"):
        word = re.sub(rf"(?<![\w/]){re.escape(placeholder)}(?![\w/])", str(where[placeholder]), word)
    return word


def test_the_section_follows_the_ladder_and_the_setup_stays_two_commands():
    text = README.read_text()
    assert text.index("## What it does") < text.index(TITLE) < text.index("## The trainer underneath")
    setup = [line.split("#")[0].strip() for line in text.splitlines() if line.startswith("    make ")]
    assert setup == ["make demo", "make test"]
    words = {w for c in command_lines() for w in c}
    for flag in ("--checkpoint.initial_hf=DIR", "--data.source=dataset", "--data.tokenizer=hf",
                 "--data.tokenizer_path=DIR", "--validation.enable=true", "--data.format=chat"):  # fmt: skip
        assert flag in words, flag
    assert "onboard recipe mymodel" in section() and "AutoModelForCausalLM" in section()


def test_the_toml_snippet_loads_into_the_workspace_recipe(where):
    (snippet,) = blocks("toml")
    keys = tomllib.loads(snippet)
    recipe = where["root"] / RECIPE
    merged = tomllib.loads(recipe.read_text())
    for sec, values in keys.items():  # "merged into its sections of the same name"
        merged.setdefault(sec, {}).update({k: fill(v, where) if isinstance(v, str) else v for k, v in values.items()})
    recipe.write_text(tomli_w.dumps(merged))
    cfg = load_config(recipe)
    base = recipe.parent
    assert cfg.checkpoint.initial_hf == str(where["DIR"]) and cfg.data.tokenizer_path == str(where["DIR"])
    assert cfg.checkpoint.export_hf == str(base / keys["checkpoint"]["export_hf"])  # the recipe's folder anchors it
    assert cfg.data.path == str(base / keys["data"]["path"]) and cfg.validation.path == str(base / "data/val.jsonl")
    assert (cfg.data.source, cfg.data.tokenizer, cfg.validation.enable, cfg.metrics.tensorboard) == (
        "dataset", "hf", True, True)  # fmt: skip
    for sec, values in keys.items():
        for k, v in values.items():
            if not isinstance(v, str):
                assert get_key(cfg, f"{sec}.{k}") == v, f"{sec}.{k}"


def test_every_key_the_prose_names_exists(where):
    """Beyond the code blocks: each `--section.key=value` and `section.key = value` the text names loads."""
    text = section()
    flags = re.findall(r"(?<![\w-])--([a-z_]+\.[a-z_]+(?:=[^\s`]+)?)", text)
    settings = re.findall(r"`([a-z_]+\.[a-z_]+) = ([^`]+)`", text)
    assert len(flags) > 20 and ("metrics.tensorboard", "true") in settings
    for flag in flags:
        if "=" in flag:
            load_config(None, ["--" + fill(flag, where)])
        else:  # a flag named in passing (`--training.batch_size` is per process): a field of the config
            get_key(load_config(None, []), flag)
    for key, value in settings:
        cfg = load_config(None, [f"--{key}={value.strip().strip(chr(34))}"])
        assert str(get_key(cfg, key)).lower() == value.strip().strip(chr(34)).lower(), key
    # the bare names too (`data.field`, `checkpoint.enable`, ...): each a field of the config
    for key in set(re.findall(r"`([a-z_]+\.[a-z_]+)`", text)) - {"recipe.toml", "metrics.jsonl", "config.json",
                                                                 "model.safetensors", "tokenizer.json",
                                                                 "tokenizer_config.json", "loss_curves.png", "twin.json",
                                                                 "titan_core.train"}:  # fmt: skip
        get_key(load_config(None, []), key)


def test_every_override_and_onboard_option_exists(where):
    cli = typer.main.get_command(app)
    lines = command_lines()
    torchrun = [c for c in lines if c[0] == "torchrun"]
    assert len(torchrun) == 2
    for words in torchrun:
        config, _, overrides = parse_argv([fill(w, where) for w in train_argv(words)])
        assert config == RECIPE
        cfg = load_config(config, overrides)
        for flag in overrides:
            key, value = flag[2:].split("=", 1)
            got = get_key(cfg, key)
            assert str(got).lower() == value.lower(), (flag, got)  # command-line paths: relative to the cwd
    onboard = [c for c in lines if c[0] == "onboard"]
    assert [c[1] for c in onboard] == ["export", "export"]
    for words in onboard:
        options = {o for p in cli.commands[words[1]].params for o in p.opts}
        assert all(w in options for w in words[2:] if w.startswith("--")), words
    # where the section says the event files and checkpoints are: the workspace recipe's output_dir
    cfg = load_config(RECIPE)
    out = Path(cfg.metrics.output_dir).relative_to(where["root"])
    assert out == Path(OUTPUT)
    (tb,) = [c for c in lines if c[0] == "tensorboard"]
    assert tb[1:] == ["--logdir", str(out / TENSORBOARD_DIR)]
    step = next(w for c in onboard for w in c if w.endswith("step-1000"))
    assert step == str(out / cfg.checkpoint.folder / "step-1000")


def test_the_loop_it_shows_runs_exports_and_reloads(where, capsys):
    from titan_core.train import main

    first = next(c for c in command_lines() if c[0] == "torchrun")
    root = where["root"]
    # later flags win: 2 steps in seconds (not the README's 1000), the metrics where the recipe puts them
    tiny = tiny_run_flags(root / OUTPUT, steps=2, batch_size=2) + ["--validation.freq=1", "--validation.steps=1"]
    argv = [fill(w, where) for w in train_argv(first)] + tiny
    assert main(argv) == 0, capsys.readouterr().err
    rows = read_metrics(root / OUTPUT / "metrics.jsonl")
    assert [r["step"] for r in rows if "val_loss" in r] == [1, 2]
    exported = where["/abs/path/exported"]
    names = {p.name for p in exported.iterdir()}
    # one file under export_shard_mb's 5000 MB (save_pretrained names a lone shard model.safetensors)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert INDEX not in names
    # `onboard export` from the run's checkpoint, both of the section's lines
    runner = CliRunner()
    for words in (c for c in command_lines() if c[0] == "onboard"):
        args = [w.replace("step-1000", "step-2") for w in words[1:]]
        result = runner.invoke(app, [*args, "--dir", str(root)])
        assert result.exit_code == 0, result.output
    assert (root / "exported/mymodel" / "config.json").is_file()
    (snippet,) = blocks("python")
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        exec(compile(snippet.replace('"exported/mymodel"', repr(str(exported))), "README.md", "exec"), {})
    assert shown.getvalue().strip()
