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
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)
import tomli_w
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "core"))  # the tiny checkpoint and data helpers
from hf_data import conversation, doc_text, vocab_size, write_jsonl, write_tokenizer  # noqa: E402
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


LAUNCH = ["python", "-m", "titan_core.launch"]
"""How the section's multi-process lines start: torchrun's arguments follow, then `-m titan_core.train ARGS`."""


def launch_lines() -> list[list[str]]:
    return [c for c in command_lines() if c[:3] == LAUNCH]


def train_argv(words: list[str]) -> list[str]:
    """The titan_core.train arguments of a launch line (`python -m titan_core.launch [torchrun's options]
    -m titan_core.train ARGS`)."""
    assert words[:3] == LAUNCH and "-m" in words[3:], words
    i = words.index("-m", 3)
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
    snippet = blocks("toml")[0]  # the second: [lora]'s (test_the_lora_snippets_...)
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
                                                                 "titan_core.train", "adapter_model.safetensors",
                                                                 "adapter_config.json", "self_attn.o_proj"}:  # fmt: skip
        get_key(load_config(None, []), key)


def test_every_override_and_onboard_option_exists(where):
    cli = typer.main.get_command(app)
    lines = command_lines()
    launches = launch_lines()
    assert len(launches) == 2 and not [c for c in lines if c[0] == "torchrun"]
    for words in launches:
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

    first = launch_lines()[0]
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
    snippet = blocks("python")[0]  # the reload (the second: the weight stream, below)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        exec(compile(snippet.replace('"exported/mymodel"', repr(str(exported))), "README.md", "exec"), {})
    assert shown.getvalue().strip()


def test_the_weight_stream_loop_it_shows_runs(tmp_path):
    """The section's second snippet, a weight sync into an inference engine after each step, as written: on the
    tiny Llama in one process, 2 steps from its checkpoint into a transformers model of the checkpoint; then
    the engine computes the trained model's logits (the gates' fp32 bound), no longer the checkpoint's."""
    import torch
    import transformers
    from hf_tiny import tiny_cfg

    from titan_core.training.trainer import Trainer

    ckpt = write_tiny_llama(tmp_path / "llama")
    trainer = Trainer(tiny_cfg(ckpt, tmp_path / "run", steps=2), quiet=True)
    engine = transformers.AutoModelForCausalLM.from_pretrained(ckpt).float().eval()
    prompts = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        before = engine(prompts).logits
    snippet = blocks("python")[1]  # the third: the PEFT reload (test_the_lora_snippets_...)
    scope = {"trainer": trainer, "engine": engine, "steps": 2, "prompts": prompts}
    exec(compile(snippet, "README.md", "exec"), scope)
    assert trainer.step == 2 and scope["rollouts"].shape[1] > prompts.shape[1]  # generated with the new weights
    with torch.no_grad():
        theirs, ours = engine(prompts).logits, trainer.model(prompts)
    assert ((theirs - ours).norm() / ours.norm()).item() <= 1e-5
    assert ((before - ours).norm() / ours.norm()).item() > 1e-3  # the 2 steps moved the weights it streamed


def test_the_lora_snippets_train_export_and_reload(tmp_path):
    """The [lora] recipe snippet, as written, trains a step on the tiny Llama from its checkpoint and writes the
    PEFT adapter; the reload snippet, as written, gives the trained model's logits (the gates' fp32 bound)."""
    import torch

    from titan_core.training.trainer import Trainer

    assert len(blocks("toml")) == 2 and len(blocks("python")) == 3
    ckpt = write_tiny_llama(tmp_path / "model")
    adapter = tmp_path / "adapter"
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(blocks("toml")[1].replace('"DIR"', repr(str(ckpt))).replace("/abs/path/adapter", str(adapter)))
    keys = tomllib.loads(recipe.read_text())
    cfg = load_config(recipe, [f"--model.hf_config={ckpt / 'config.json'}", *tiny_run_flags(tmp_path / "out", steps=1,
                                                                                            batch_size=2)])  # fmt: skip
    for k, v in keys["lora"].items():
        assert get_key(cfg, f"lora.{k}") == v, k
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    assert {p.name for p in adapter.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    scope: dict = {}
    code = blocks("python")[2].replace('"DIR"', repr(str(ckpt))).replace('"/abs/path/adapter"', repr(str(adapter)))
    exec(compile(code, "README.md", "exec"), scope)
    tokens = torch.tensor([[1, 5, 9, 2, 7, 40, 3]])
    with torch.no_grad():
        theirs, ours = scope["model"](tokens).logits, trainer.model(tokens)
    assert ((theirs - ours).norm() / ours.norm()).item() <= 1e-5


def test_the_multi_process_line_refuses_a_missing_data_path_once(where, capfd):
    """Checked once by the launcher before any rank starts: one line, exit 2, no rank's copy of it, no
    torchrun traceback, nothing written. The line's `python -m titan_core.launch` is its main(argv) in this
    process (the code `python -m` exits with); file descriptor 2 is read, where a rank or torchrun would write."""
    from titan_core import launch

    words = [fill(w, where) for w in launch_lines()[0]]
    words = ["--data.path=data/missing.jsonl" if w.startswith("--data.path=") else w for w in words]
    assert words[:3] == LAUNCH and Path.cwd() == where["root"]
    capfd.readouterr()
    code = launch.main(words[3:])
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if not line.startswith("warning: ")]  # a 1-core machine's
    assert code == 2 and said == ["error: data.path 'data/missing.jsonl' does not exist"], err
    assert not (where["root"] / OUTPUT).exists()


def _flat(section_text: str) -> str:
    return " ".join(section_text.split())


def _rows(path: Path, tok_dir: Path, seq_len: int, **data) -> list:
    from titan_core.config import JobConfig
    from titan_core.data import build_data_loader

    cfg = JobConfig()
    cfg.training.batch_size, cfg.training.seq_len = 1, seq_len
    cfg.data.source, cfg.data.path = "dataset", str(path)
    cfg.data.tokenizer, cfg.data.tokenizer_path = "hf", str(tok_dir)
    cfg.data.max_epochs = 0  # two documents read for one row, not a training plan
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return next(build_data_loader(cfg, vocab_size=vocab_size()))


def test_from_text_to_loss_is_what_the_packing_does(tmp_path):
    """The section's account of a packed row (BOS when the tokenizer adds one, EOS after each document, the
    label across a boundary dropped, positions restarting, attention per document), held against a row
    the loader makes of two documents, and a tiny model's logits on it against each document alone."""
    import torch

    from titan_core.data import IGNORE_INDEX, load_hf_tokenizer
    from titan_core.models.model_builder import build_model_from_config

    text = _flat(section())
    for claim in ("BOS + its tokens + EOS, where BOS comes only when the tokenizer adds one",
                  "attention stays inside each document and positions restart at 0 where a document starts",
                  "the label of a document's last token, its EOS, is dropped (-100)", "EOS itself is a label",
                  "padded with EOS whose labels are dropped"):  # fmt: skip
        assert claim in text, claim
    docs = [doc_text(1), doc_text(2)]
    path = write_jsonl(tmp_path / "two.jsonl", [{"text": d} for d in docs])
    with_bos = write_tokenizer(tmp_path / "tok")  # add_bos_token: true
    no_bos = write_tokenizer(tmp_path / "tok_qwen", config={"bos_token": None, "eos_token": "</s>"})
    for folder, bos in ((with_bos, True), (no_bos, False)):
        tok = load_hf_tokenizer(str(folder), model_vocab_size=vocab_size())
        ids = [[tok.bos_id] * bos + tok.encode(d) + [tok.eos_id] for d in docs]
        a, b = len(ids[0]), len(ids[1])
        row = _rows(path, folder, a + b - 1)  # one row holds both documents: S + 1 tokens
        assert row.tokens[0].tolist() == (ids[0] + ids[1])[:-1]
        want = (ids[0] + ids[1])[1:]
        want[a - 1] = IGNORE_INDEX  # the first document's EOS: its next token opens the second
        assert row.labels[0].tolist() == want and want[a - 2] == tok.eos_id  # EOS is a label
        assert row.segment_ids[0].tolist() == [0] * a + [1] * (b - 1)
        assert row.positions[0].tolist() == list(range(a)) + list(range(b - 1))
    tok = load_hf_tokenizer(str(with_bos), model_vocab_size=vocab_size())
    ids = [[tok.bos_id] + tok.encode(d) + [tok.eos_id] for d in docs]
    a, b = len(ids[0]), len(ids[1])
    # not packed: the first document in a row of its own, padded with EOS whose labels are dropped
    alone = _rows(path, with_bos, a + 4, pack_documents=False)
    assert alone.tokens[0].tolist() == ids[0] + [tok.eos_id] * 4 and alone.segment_ids is None
    assert alone.labels[0].tolist() == ids[0][1:] + [IGNORE_INDEX] * 5
    # attention inside each document: a tiny model's logits on the packed row are each document's alone
    cfg = load_config(None, ["--model.overrides={n_layers = 1, dim = 32, n_heads = 2, n_kv_heads = 2, "
                             f"ffn_hidden_dim = 64, vocab_size = {vocab_size()}}}"])  # fmt: skip
    model = build_model_from_config(cfg.model)[2]
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    row = _rows(path, with_bos, a + b - 1)
    with torch.no_grad():
        packed = model(row.tokens, positions=row.positions, segment_ids=row.segment_ids)
        first, second = model(torch.tensor([ids[0]])), model(torch.tensor([ids[1][:-1]]))
        ignored = model(row.tokens)  # the same row without the mask: the second document sees the first
    torch.testing.assert_close(packed[0, :a], first[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[0, a:], second[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ignored[0, a:], second[0], rtol=1e-3, atol=1e-3)


def test_chat_targets_are_the_assistants_header_content_and_end_of_turn(tmp_path):
    from titan_core.data import IGNORE_INDEX, load_hf_tokenizer

    text = _flat(section())
    assert "no BOS or EOS added: the template writes its own" in text
    assert "its header (" in text and "its content and its end-of-turn token" in text
    assert "system and user turns are context, their labels dropped" in text
    assert "Packed, conversations follow one another like documents (nothing added between them)" in text
    tok_dir = write_tokenizer(tmp_path / "tok")
    convs = [conversation(1), conversation(2)]  # system, user, assistant(, user, assistant)
    path = write_jsonl(tmp_path / "chat.jsonl", convs)
    tok = load_hf_tokenizer(str(tok_dir), model_vocab_size=vocab_size())
    # the hf_data template: "{{ bos_token }}" then "<|role|> content <|end|> " per message
    turns = [[tok.encode(f"<|{m['role']}|> {m['content']} <|end|>") for m in c["messages"]] for c in convs]
    whole = [[tok.bos_id] + [t for turn in ts for t in turn] for ts in turns]
    row = _rows(path, tok_dir, len(whole[0]) + len(whole[1]) - 1, format="chat")
    assert row.tokens[0].tolist() == (whole[0] + whole[1])[:-1]  # the template's BOS; no EOS of the loader's
    assert row.segment_ids[0].tolist() == [0] * len(whole[0]) + [1] * (len(whole[1]) - 1)
    targets = [t for c, ts in zip(convs, turns) for m, turn in zip(c["messages"], ts) for t in turn
               if m["role"] == "assistant"]  # fmt: skip
    assert [x for x in row.labels[0].tolist() if x != IGNORE_INDEX] == targets
    header, end = tok.encode("<|assistant|>")[0], tok.encode("<|end|>")[0]
    assert targets.count(header) == 3 and targets.count(end) == 3  # each assistant turn's header and end of turn
