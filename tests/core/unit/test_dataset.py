"""data.source = "dataset": JSONL / JSON / Parquet / text files streamed through `datasets`,
packed like the text source, sharded by rank, resumable bit for bit, bad rows counted."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from hf_data import doc_text, write_jsonl, write_tokenizer

from titan_core.config import ConfigError, JobConfig
from titan_core.data import DatasetLoader, build_data_loader, load_hf_tokenizer
from titan_core.data.base import IGNORE_INDEX
from titan_core.train import run

DOCS = [doc_text(i) for i in range(40)]
VOCAB = 512
MODEL = (
    "--model.overrides={n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_hidden_dim = 128, vocab_size = 512}"
)
SMALL_MODEL = (
    "--model.overrides={n_layers = 1, dim = 32, n_heads = 2, n_kv_heads = 2, ffn_hidden_dim = 64, vocab_size = 512}"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def _cfg(path, tok_dir, *, batch_size=2, seq_len=16, **data) -> JobConfig:
    cfg = JobConfig()
    cfg.training.batch_size, cfg.training.seq_len = batch_size, seq_len
    cfg.data.source, cfg.data.path = "dataset", str(path)
    cfg.data.tokenizer, cfg.data.tokenizer_path = "hf", str(tok_dir)
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


def _take(loader, n):
    return [next(loader) for _ in range(n)]


def _same(a, b) -> bool:
    def eq(x, y):
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    return all(eq(getattr(a, f), getattr(b, f)) for f in ("tokens", "labels", "positions", "segment_ids"))


def _stream(batches) -> list[int]:
    """The token stream the packed rows were cut from: rows overlap by one token, so their inputs abut."""
    return [t for b in batches for row in b.tokens.tolist() for t in row]


def _doc_markers(tok, ids: list[int]) -> list[int]:
    """The document numbers (doc<i> words) in a stream of ids, in order."""
    return [int(m) for m in re.findall(r"\bdoc(\d+)\b", tok.decode(ids))]


# ---- reading and packing ---------------------------------------------------------------
def test_jsonl_packs_documents_with_eos_between_them(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": d, "id": i} for i, d in enumerate(DOCS)])
    loader = build_data_loader(_cfg(path, tok_dir), vocab_size=VOCAB)
    assert isinstance(loader, DatasetLoader)
    tok = load_hf_tokenizer(str(tok_dir), model_vocab_size=VOCAB)
    want = [i for d in DOCS[:10] for i in (tok.bos_id, *tok.encode(d), tok.eos_id)]
    batches = _take(loader, 3)
    got = _stream(batches)
    assert got == want[: len(got)]
    b = batches[0]
    for r in range(2):  # a document's last token has no target; positions restart with each document
        tokens, labels, seg, pos = b.tokens[r], b.labels[r], b.segment_ids[r], b.positions[r]
        for t in range(15):
            same = bool(seg[t] == seg[t + 1])
            assert (labels[t] == tokens[t + 1]) if same else (labels[t] == IGNORE_INDEX and tokens[t] == tok.eos_id)
            assert pos[t + 1] == (pos[t] + 1 if same else 0)


def test_the_same_rows_from_json_parquet_and_text_files(tmp_path, tok_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = DOCS[:12]
    jsonl = write_jsonl(tmp_path / "a" / "c.jsonl", [{"text": d} for d in docs])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "c.json").write_text(json.dumps([{"text": d, "n": i} for i, d in enumerate(docs)]))
    (tmp_path / "c").mkdir()
    pq.write_table(pa.table({"n": list(range(12)), "body": docs}), tmp_path / "c" / "c.parquet", row_group_size=5)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "c.txt").write_text("\n\n".join(docs) + "\n")
    lines = write_jsonl(tmp_path / "e" / "c.json", [{"text": d} for d in docs], raw_lines={3: "{broken"})
    want = _take(build_data_loader(_cfg(jsonl, tok_dir), vocab_size=VOCAB), 4)
    cases = (
        (tmp_path / "b", "text"),
        (tmp_path / "c" / "*.parquet", "body"),
        (tmp_path / "d", "text"),
        (lines, "text"),
    )
    for path, field in cases:
        got = _take(build_data_loader(_cfg(path, tok_dir, field=field), vocab_size=VOCAB), 4)
        assert all(_same(x, y) for x, y in zip(got, want)), path


def test_rows_equal_the_text_sources_rows(tmp_path, tok_dir):
    """One packing: the in-memory text source and the stream cut the same documents into the same rows."""
    docs = DOCS[:12]
    (tmp_path / "c.txt").write_text("\n\n".join(docs) + "\n")
    jsonl = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in docs])
    for packed in (True, False):
        text_cfg = _cfg(tmp_path / "c.txt", tok_dir, pack_documents=packed)
        text_cfg.data.source = "text"
        want = _take(build_data_loader(text_cfg, vocab_size=VOCAB), 3)  # within the text source's first epoch
        got = _take(build_data_loader(_cfg(jsonl, tok_dir, pack_documents=packed), vocab_size=VOCAB), 3)
        assert all(_same(x, y) for x, y in zip(got, want)), packed


def test_bad_rows_are_counted_logged_and_skipped(tmp_path, tok_dir, caplog):
    rows = [{"text": d} for d in DOCS[:10]]
    rows[1] = {"title": "no text field"}
    rows[3] = {"text": None}
    rows[4] = {"text": 17}
    rows[6] = {"text": "   "}
    path = write_jsonl(tmp_path / "c.jsonl", rows, raw_lines={2: '{"text": "broken', 8: "[1, 2]", 9: ""})
    loader = build_data_loader(_cfg(path, tok_dir, seq_len=8), vocab_size=VOCAB)
    tok = loader.tokenizer
    with caplog.at_level(logging.WARNING, logger="titan_core.data"):
        batches = _take(loader, 12)  # past the end: the second pass counts nothing again
    kept = [0, 2, 5, 7, 8, 9]
    assert _doc_markers(tok, _stream(batches))[:6] == kept
    report = loader.report()
    assert report["bad"] == {"missing": 2, "non_string": 1, "empty": 1, "broken_json": 1, "not_object": 1}
    assert report["bad_rows"] == 6 and report["epoch"] >= 1
    assert loader.state_dict()["bad"] == report["bad"]
    lines = [r.getMessage() for r in caplog.records if r.name == "titan_core.data"]
    assert [int(m.split()[1]) for m in lines] == [1, 2, 4]  # a line each time the count reaches a power of two
    assert "c.jsonl" in lines[-1] and "broken JSON line: 1" in lines[-1]


def test_ranks_read_disjoint_documents_whose_union_is_all(tmp_path, tok_dir):
    """Two files: a file per rank; one file: every other row. Either way disjoint, together everything."""
    one = write_jsonl(tmp_path / "one" / "c.jsonl", [{"text": d} for d in DOCS[:20]])
    two = tmp_path / "two"
    write_jsonl(two / "a.jsonl", [{"text": d} for d in DOCS[:11]])
    write_jsonl(two / "b.jsonl", [{"text": d} for d in DOCS[11:20]])
    for path in (one, two):
        seen = []
        for rank in range(2):
            cfg = _cfg(path, tok_dir, batch_size=1, seq_len=16)
            loader = build_data_loader(cfg, vocab_size=VOCAB, dp_rank=rank, dp_world=2)
            loader.endless = False
            batches = []
            with pytest.raises(StopIteration):
                while True:
                    batches.append(next(loader))
            seen.append(set(_doc_markers(loader.tokenizer, _stream(batches))))
        assert seen[0] and seen[1] and not seen[0] & seen[1], path
        # the last, incomplete row of each rank is dropped: only its documents may be missing
        assert len(seen[0] | seen[1]) >= 16 and seen[0] | seen[1] <= set(range(20)), path


def test_state_resumes_the_same_stream_and_refuses_another_shard(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS[:9]])
    cfg = _cfg(path, tok_dir, seq_len=12)
    straight = _take(build_data_loader(cfg, vocab_size=VOCAB), 12)  # wraps into later epochs
    for cut in (0, 1, 3, 7):
        first = build_data_loader(cfg, vocab_size=VOCAB)
        _take(first, cut)
        state = first.state_dict()
        resumed = build_data_loader(cfg, vocab_size=VOCAB)
        resumed.load_state_dict(state)
        assert all(_same(a, b) for a, b in zip(_take(resumed, 12 - cut), straight[cut:])), cut
        assert resumed.step == 12
    other = build_data_loader(cfg, vocab_size=VOCAB, dp_rank=0, dp_world=2)
    with pytest.raises(ConfigError, match="same number of data-parallel ranks"):
        other.load_state_dict(state)


def test_batch_at_and_repeat_batch(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS[:9]])
    loader = build_data_loader(_cfg(path, tok_dir), vocab_size=VOCAB)
    batches = _take(loader, 3)
    assert _same(loader.batch_at(1), batches[1]) and _same(next(loader), loader.batch_at(3))
    repeat = build_data_loader(_cfg(path, tok_dir, repeat_batch=True), vocab_size=VOCAB)
    assert all(_same(b, batches[0]) for b in _take(repeat, 3))


def test_resume_through_the_trainer_continues_the_token_stream(tmp_path, tok_dir):
    """4 steps straight vs 2 steps, a checkpoint, and a resumed run: steps 3-4 get the same rows and losses."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": d} for d in DOCS])
    args = [
        MODEL,
        "--training.batch_size=2", "--training.seq_len=32", "--training.deterministic", "--device.type=cpu",
        "--device.threads=1", "--metrics.rich=false", "--data.source=dataset", f"--data.path={path}",
        "--data.tokenizer=hf", f"--data.tokenizer_path={tok_dir}", "--checkpoint.interval=2",
    ]  # fmt: skip
    from titan_core.config import load_config
    from titan_core.training.trainer import Trainer

    def train(out, steps, *extra):
        cfg = load_config(None, [*args, f"--metrics.output_dir={out}", f"--training.steps={steps}", *extra])
        trainer = Trainer(cfg, quiet=True)
        rows = _Recorder(trainer.data)
        trainer.data = rows
        result = trainer.train()
        return result, rows.seen

    straight, want = train(tmp_path / "a", 4)
    train(tmp_path / "b", 2, "--checkpoint.enable")
    resumed, got = train(tmp_path / "b", 4, "--checkpoint.enable")
    assert resumed.resumed_from == 2 and len(got) == 2
    assert all(torch.equal(g, w) for g, w in zip(got, want[2:]))
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in straight.metrics[2:]]


class _Recorder:
    """A loader that keeps the tokens and labels of every micro-batch it hands out."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __next__(self):
        b = next(self.inner)
        self.seen.append(torch.cat([b.tokens, b.labels]))
        return b

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_run_reports_its_bad_rows(tmp_path, tok_dir):
    rows = [{"text": d} for d in DOCS[:30]] + [{"body": "x"}] * 3
    path = write_jsonl(tmp_path / "c.jsonl", rows, raw_lines={5: "{oops"})
    from titan_core.config import load_config

    cfg = load_config(None, [
        SMALL_MODEL,
        "--training.batch_size=2", "--training.seq_len=16", "--training.steps=2", "--device.type=cpu",
        "--metrics.rich=false", f"--metrics.output_dir={tmp_path / 'out'}", "--data.source=dataset",
        f"--data.path={path}", "--data.tokenizer=hf", f"--data.tokenizer_path={tok_dir}",
    ])  # fmt: skip
    result = run(cfg, quiet=True)
    assert result.data["bad"] == {"broken_json": 1, "missing": 3} and result.data["documents"] == 30


# ---- bad input -------------------------------------------------------------------------
def test_bad_paths_and_fields_are_config_errors_naming_them(tmp_path, tok_dir):
    def build(path, **data):
        return build_data_loader(_cfg(path, tok_dir, **data), vocab_size=VOCAB)

    with pytest.raises(ConfigError, match="nothing.jsonl' does not exist"):
        build(tmp_path / "nothing.jsonl")
    with pytest.raises(ConfigError, match=r"\*.parquet' matches no file"):
        build(tmp_path / "*.parquet")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ConfigError, match="empty_dir' holds no data file"):
        build(tmp_path / "empty_dir")
    (tmp_path / "mixed").mkdir()
    write_jsonl(tmp_path / "mixed" / "a.jsonl", [{"text": "x"}])
    (tmp_path / "mixed" / "b.txt").write_text("x")
    with pytest.raises(ConfigError, match="mixes jsonl and text files"):
        build(tmp_path / "mixed")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="empty.jsonl' holds no rows"):
        build(tmp_path / "empty.jsonl")
    path = write_jsonl(tmp_path / "c.jsonl", [{"body": d} for d in DOCS[:5]], raw_lines={1: "{broken"})
    with pytest.raises(
        ConfigError, match=r"data.field 'text': no row of the first 6 of '.*c.jsonl' has it \(columns seen: body; 1 of"
    ):
        build(path)
    with pytest.raises(ConfigError, match="bpe' is trained on the whole corpus"):
        build(path, field="body", tokenizer="bpe")
    big = write_tokenizer(tmp_path / "big", extra_words=300)
    with pytest.raises(ConfigError, match="big/tokenizer.json' has"):
        build(path, field="body", tokenizer_path=str(big))


def test_an_empty_validation_set_names_its_file(tmp_path, tok_dir):
    from titan_core.config import load_config
    from titan_core.training.trainer import Trainer

    train = write_jsonl(tmp_path / "train.jsonl", [{"text": d} for d in DOCS])
    (tmp_path / "val.jsonl").write_text("\n\n")
    cfg = load_config(None, [
        SMALL_MODEL,
        "--training.batch_size=2", "--training.seq_len=16", "--training.steps=2", "--device.type=cpu",
        "--metrics.rich=false", f"--metrics.output_dir={tmp_path / 'out'}", "--data.source=dataset",
        f"--data.path={train}", "--data.tokenizer=hf", f"--data.tokenizer_path={tok_dir}",
        "--validation.enable", f"--validation.path={tmp_path / 'val.jsonl'}",
    ])  # fmt: skip
    with pytest.raises(ConfigError, match="val.jsonl' holds no rows"):
        Trainer(cfg, quiet=True)
