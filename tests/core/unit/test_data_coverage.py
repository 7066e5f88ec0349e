"""Data too broken or too small for the run is refused, and a run says how many epochs it went through:
data.min_valid_fraction (usable rows against all rows), data.max_epochs (passes the planned steps x
batch x seq_len need), the epochs as a fraction, and the paths a launcher checks once."""

from __future__ import annotations

import copy
import json
import re

import pytest
from hf_data import doc_text, vocab_size, write_jsonl, write_tokenizer

import titan_core.data.dataset as dataset
import titan_core.data.dataset_files as dataset_files
from titan_core.config import ConfigError, JobConfig, load_config
from titan_core.data import build_data_loader, load_hf_tokenizer
from titan_core.data.loader import check_data_paths
from titan_core.train import main
from titan_core.training.validate import validation_config

VOCAB = vocab_size()
SMALL_MODEL = (
    "--model.overrides={n_layers = 1, dim = 32, n_heads = 2, n_kv_heads = 2, ffn_hidden_dim = 64, "
    f"vocab_size = {VOCAB}}}"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def _cfg(path, tok_dir, *, steps=30, batch_size=2, seq_len=16, **data) -> JobConfig:
    cfg = JobConfig()
    cfg.training.steps, cfg.training.batch_size, cfg.training.seq_len = steps, batch_size, seq_len
    cfg.data.source, cfg.data.path = "dataset", str(path)
    cfg.data.tokenizer, cfg.data.tokenizer_path = "hf", str(tok_dir)
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


def _one_of_three(tmp_path):
    path = tmp_path / "one_of_three.jsonl"
    path.write_text(json.dumps({"text": doc_text(1)}) + '\n{"title": "no text"}\n{"text": ""}\n')
    return path


def test_mostly_bad_rows_exit_2_with_one_line_and_nothing_written(tmp_path, tok_dir, capsys):
    """The probe's case: 1 usable row of 3 trained '171 documents in 171 epochs' and exited 0."""
    path, out = _one_of_three(tmp_path), tmp_path / "run"
    argv = [SMALL_MODEL, "--data.source=dataset", f"--data.path={path}", "--data.tokenizer=hf",
            f"--data.tokenizer_path={tok_dir}", "--training.steps=3", "--training.batch_size=2",
            "--training.seq_len=16", "--device.type=cpu", "--metrics.rich=false",
            f"--metrics.output_dir={out}"]  # fmt: skip
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: data file '{path}': only 1 of 3 rows are usable documents (33%), fewer than "
                    "data.min_valid_fraction = 0.5 (empty: 1, field missing or null: 1); fix the data or "
                    "data.field, or lower --data.min_valid_fraction")  # fmt: skip
    assert not out.exists()
    # overridable, and range-checked like every fraction
    build_data_loader(_cfg(path, tok_dir, steps=3, min_valid_fraction=0.3), vocab_size=VOCAB)
    assert main([*argv, "--data.min_valid_fraction=1.5"]) == 2
    assert "data.min_valid_fraction = 1.5 is out of range: it must be in [0, 1]" in capsys.readouterr().err


def test_a_shard_judged_when_its_first_pass_ends(tmp_path, tok_dir, monkeypatch):
    """Past the rows read before step 1 (PROBE_ROWS; 4 here), the whole shard is judged at the end of its
    first pass: bad rows beyond the probe, and a corpus too small for the plan."""
    monkeypatch.setattr(dataset, "PROBE_ROWS", 4)  # the rows read ahead before step 1
    monkeypatch.setattr(dataset_files, "PROBE_ROWS", 4)  # the first rows every rank checks
    rows = [{"text": doc_text(i)} for i in range(4)] + [{"text": 7}] * 6
    path = write_jsonl(tmp_path / "tail.jsonl", rows)
    loader = build_data_loader(_cfg(path, tok_dir, steps=3, max_epochs=0), vocab_size=VOCAB)
    with pytest.raises(ConfigError, match=r"only 4 of 10 rows are usable documents \(40%\)"):
        for _ in range(20):
            next(loader)
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": doc_text(i)} for i in range(8)])
    loader = build_data_loader(_cfg(small, tok_dir, steps=2000), vocab_size=VOCAB)  # 4 rows read: not judged yet
    assert loader.pass_rows is None
    with pytest.raises(ConfigError, match=r"small.jsonl' holds 8 documents, .* more than data.max_epochs = 100"):
        for _ in range(20):
            next(loader)


def test_a_corpus_too_small_for_the_plan_is_refused_before_step_1(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": doc_text(i)} for i in range(3)])
    tok = load_hf_tokenizer(str(tok_dir), model_vocab_size=VOCAB)
    tokens = sum(len(tok.encode(doc_text(i))) + 2 for i in range(3))  # BOS + text + EOS each
    with pytest.raises(ConfigError) as refused:
        build_data_loader(_cfg(path, tok_dir, steps=100, batch_size=4), vocab_size=VOCAB)
    epochs = 100 * 4 * 16 / tokens
    assert str(refused.value) == (
        f"data file '{path}' holds 3 documents, {tokens} tokens, {tokens / 16:.1f} rows of seq_len 16 per epoch, "
        f"but the run plans 100 steps x 1 micro-batch x batch_size 4 = 400 rows of seq_len 16 (6,400 tokens): "
        f"{epochs:,.0f} epochs, more than data.max_epochs = 100; add data, lower training.steps, or raise "
        "--data.max_epochs (0: no bound)"
    )
    build_data_loader(_cfg(path, tok_dir, steps=100, batch_size=4, max_epochs=0), vocab_size=VOCAB)  # no bound
    build_data_loader(_cfg(path, tok_dir, steps=10, batch_size=4), vocab_size=VOCAB)  # within the bound
    # the text source knows its rows at once; grad_accum counts too
    text = tmp_path / "c.txt"
    text.write_text("\n\n".join(doc_text(i) for i in range(12)))
    cfg = _cfg(text, tok_dir, steps=200, batch_size=4)
    cfg.data.source, cfg.training.grad_accum = "text", 2
    with pytest.raises(ConfigError, match=r"200 steps x 2 micro-batches x batch_size 4 = 1,600 rows"):
        build_data_loader(cfg, vocab_size=VOCAB)


def test_the_held_out_set_is_not_held_to_the_training_plan(tmp_path, tok_dir):
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": doc_text(i)} for i in range(40)])
    held = write_jsonl(tmp_path / "val.jsonl", [{"text": doc_text(i)} for i in range(2)])
    cfg = _cfg(train, tok_dir, steps=100)
    cfg.validation.enable, cfg.validation.path = True, str(held)
    assert build_data_loader(validation_config(cfg), vocab_size=VOCAB).plan is None
    assert build_data_loader(cfg, vocab_size=VOCAB).plan is not None


def test_the_epochs_are_a_fraction_of_the_pass(tmp_path, tok_dir):
    """The end-of-run line said '1 epoch(s)' after part of one: now the rows taken over the rows of a pass."""
    rows = [{"text": doc_text(i)} for i in range(10)] + [{"title": "no text"}]  # a bad row: the line is logged
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    tok = load_hf_tokenizer(str(tok_dir), model_vocab_size=VOCAB)
    pass_rows = sum(len(tok.encode(doc_text(i))) + 2 for i in range(10)) / 16
    loader = build_data_loader(_cfg(path, tok_dir, steps=10), vocab_size=VOCAB)
    assert loader.pass_rows == pytest.approx(pass_rows)
    for taken in (2, 4, 8, 14):  # batches of 2 rows: under one pass, then past it
        while loader.rows_taken < taken:
            next(loader)
        assert loader.report()["epochs"] == pytest.approx(taken / pass_rows)
        assert f"{taken / pass_rows:.1f} epochs trained on" in loader.summary_line()
    resumed = build_data_loader(_cfg(path, tok_dir, steps=10), vocab_size=VOCAB)
    resumed.load_state_dict(loader.state_dict())
    assert resumed.epochs() == loader.epochs()
    # no bound asked for: the pass is not read ahead, and its length is unknown until it ends
    unbounded = build_data_loader(_cfg(path, tok_dir, steps=10, max_epochs=0), vocab_size=VOCAB)
    next(unbounded)
    assert unbounded.epochs() is None and "part of one epoch (its end not reached)" in unbounded.summary_line()


def test_the_paths_a_launcher_checks_once(tmp_path, tok_dir):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": doc_text(0)}])
    cfg = load_config(None, ["--data.source=dataset", f"--data.path={data}", "--data.tokenizer=hf",
                             f"--data.tokenizer_path={tok_dir}"])  # fmt: skip
    check_data_paths(cfg)
    for key, value, said in (("data.path", tmp_path / "nope.jsonl", "data.path '{}' does not exist"),
                             ("data.tokenizer_path", tmp_path / "nope", "tokenizer file '{}' does not exist"),
                             ("validation.path", tmp_path / "v.jsonl", "validation.path '{}' does not exist"),
                             ):  # fmt: skip
        bad = copy.deepcopy(cfg)
        section, field = key.split(".")
        setattr(getattr(bad, section), field, str(value))
        bad.validation.enable = section == "validation"
        with pytest.raises(ConfigError, match=re.escape(said.format(value))):
            check_data_paths(bad)
