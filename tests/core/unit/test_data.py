"""Data loaders: determinism, rank sharding, resume, tokenizers, packing and input errors."""

from __future__ import annotations

import os

import pytest
import torch

from titan_core.config import ConfigError, JobConfig
from titan_core.data import IGNORE_INDEX, ByteTokenizer, build_data_loader, split_documents
from titan_core.data import tokenizer as tokenizer_mod

PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog.",
    "A second paragraph,\nwith a line break inside it.",
    "short",
    "Ünïcödé text: naïve café, 東京, emoji 🙂.",
    "x" * 70,  # longer than a row, so a document spans rows
    "the end.",
]


def _cfg(batch_size=2, seq_len=16, **data) -> JobConfig:
    cfg = JobConfig()
    cfg.training.batch_size = batch_size
    cfg.training.seq_len = seq_len
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    # Extra blank lines and whitespace-only lines between paragraphs must not make documents.
    (folder / "a.txt").write_text("\n\n".join(PARAGRAPHS[:3]) + "\n\n \n\n")
    (folder / "b.txt").write_text("\n\n\n".join(PARAGRAPHS[3:]) + "\n")
    (folder / "notes.md").write_text("not a .txt file, never read")
    return folder


def _take(loader, n):
    return [next(loader) for _ in range(n)]


def _same(a, b) -> bool:
    def eq(x, y):
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    return all(eq(getattr(a, f), getattr(b, f)) for f in ("tokens", "labels", "positions", "segment_ids"))


# ---- synthetic ------------------------------------------------------------------------
def test_synthetic_is_deterministic_in_range_and_shifted():
    cfg = _cfg(batch_size=3, seq_len=32)
    a, b = _take(build_data_loader(cfg, vocab_size=50), 4), _take(build_data_loader(cfg, vocab_size=50), 4)
    assert all(_same(x, y) for x, y in zip(a, b))
    assert not _same(a[0], a[1])  # the stream moves on
    for batch in a:
        assert batch.tokens.shape == batch.labels.shape == (3, 32)
        assert batch.tokens.dtype == batch.labels.dtype == torch.int64
        assert 0 <= int(batch.tokens.min()) and int(batch.tokens.max()) < 50
        assert torch.equal(batch.tokens[:, 1:], batch.labels[:, :-1])  # labels are next tokens
        assert batch.positions is None and batch.segment_ids is None
    cfg.training.seed = 1
    assert not _same(next(build_data_loader(cfg, vocab_size=50)), a[0])


def test_synthetic_ranks_are_disjoint_and_together_equal_one_big_rank():
    cfg = _cfg(batch_size=2, seq_len=8)
    r0 = _take(build_data_loader(cfg, vocab_size=1000, dp_rank=0, dp_world=2), 3)
    r1 = _take(build_data_loader(cfg, vocab_size=1000, dp_rank=1, dp_world=2), 3)
    rows0 = {tuple(r.tolist()) for b in r0 for r in b.tokens}
    rows1 = {tuple(r.tolist()) for b in r1 for r in b.tokens}
    assert len(rows0) == len(rows1) == 6 and not rows0 & rows1
    # One rank with the global batch sees exactly the union, in rank order.
    whole = _take(build_data_loader(_cfg(batch_size=4, seq_len=8), vocab_size=1000), 3)
    for w, a, b in zip(whole, r0, r1):
        assert torch.equal(w.tokens, torch.cat([a.tokens, b.tokens]))


def test_repeat_batch_yields_one_fixed_batch():
    rep = _take(build_data_loader(_cfg(repeat_batch=True), vocab_size=100), 3)
    plain = next(build_data_loader(_cfg(), vocab_size=100))
    assert _same(rep[0], rep[1]) and _same(rep[1], rep[2]) and _same(rep[0], plain)


# ---- resume ---------------------------------------------------------------------------
@pytest.mark.parametrize("source,packed", [("synthetic", True), ("text", True), ("text", False)])
def test_resume_mid_stream_equals_uninterrupted(corpus, source, packed):
    cfg = _cfg(source=source, path=str(corpus), pack_documents=packed)
    # 8 micro-batches of 2 rows wrap past the end of the text corpus: epochs resume too.
    full = _take(build_data_loader(cfg, vocab_size=300, dp_rank=1, dp_world=2), 8)
    first = build_data_loader(cfg, vocab_size=300, dp_rank=1, dp_world=2)
    _take(first, 3)
    state = first.state_dict()
    resumed = build_data_loader(cfg, vocab_size=300, dp_rank=1, dp_world=2)
    resumed.load_state_dict(state)
    rest = _take(resumed, 5)
    assert all(_same(x, y) for x, y in zip(full[3:], rest))


def test_resume_refuses_other_settings():
    state = build_data_loader(_cfg(batch_size=2), vocab_size=100).state_dict()
    with pytest.raises(ConfigError, match="batch_size: saved 2, now 4"):
        build_data_loader(_cfg(batch_size=4), vocab_size=100).load_state_dict(state)


def test_batch_to_moves_every_field(corpus):
    batch = next(build_data_loader(_cfg(source="text", path=str(corpus)), vocab_size=300))
    moved = batch.to("meta")
    assert all(getattr(moved, f).device.type == "meta" for f in ("tokens", "labels", "positions", "segment_ids"))


# ---- tokenizers -----------------------------------------------------------------------
def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    for text in PARAGRAPHS:
        ids = tok.encode(text)
        assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
        assert tok.decode([tok.bos_id, *ids, tok.eos_id]) == text
    assert {tok.bos_id, tok.eos_id} == {256, 257} and tok.vocab_size == 258


def test_bpe_is_trained_once_then_loaded_from_cache(corpus, tmp_path, monkeypatch):
    cfg = _cfg(source="text", path=str(corpus), tokenizer="bpe", bpe_vocab_size=300, cache_dir=str(tmp_path / "c"))
    first = build_data_loader(cfg, vocab_size=512)
    assert not first.tokenizer.from_cache and first.tokenizer.path.is_file()
    mtime = os.stat(first.tokenizer.path).st_mtime_ns

    def no_training(*a, **k):
        raise AssertionError("the BPE was retrained although it is cached")

    monkeypatch.setattr(tokenizer_mod, "train_bpe", no_training)
    second = build_data_loader(cfg, vocab_size=512)
    assert second.tokenizer.from_cache and second.tokenizer.path == first.tokenizer.path
    assert os.stat(second.tokenizer.path).st_mtime_ns == mtime
    assert torch.equal(first.stream, second.stream)
    tok = second.tokenizer
    assert 258 < tok.vocab_size <= 300 and int(second.stream.max()) < tok.vocab_size
    assert len(second.stream) < len(build_data_loader(_cfg(source="text", path=str(corpus)), vocab_size=512).stream)
    for text in PARAGRAPHS:  # merges compress, and decoding restores the text
        assert tok.decode(tok.encode(text)) == text
    # Another vocab size is another tokenizer: it must train (and our stub says so).
    cfg.data.bpe_vocab_size = 280
    with pytest.raises(AssertionError, match="retrained"):
        build_data_loader(cfg, vocab_size=512)


# ---- packing --------------------------------------------------------------------------
def test_split_documents_uses_blank_lines():
    assert split_documents("a\nb\n\n\n  \t\nc\n \n d\n") == ["a\nb", "c", " d"]


def test_packed_rows_restart_segments_and_positions_at_document_starts(corpus):
    S = 16
    loader = build_data_loader(_cfg(seq_len=S, source="text", path=str(corpus)), vocab_size=300)
    bos, eos = 256, 257
    stream = [t for p in PARAGRAPHS for t in (bos, *p.encode("utf-8"), eos)]
    assert loader.num_documents == len(PARAGRAPHS) and loader.num_rows == (len(stream) - 1) // S
    for g in range(loader.num_rows):
        tokens, labels, positions, segments = loader.row(g)
        window = stream[g * S : g * S + S + 1]
        assert tokens.tolist() == window[:-1]
        seg, pos = 0, 0
        for i, tok in enumerate(window[:-1]):
            if i > 0 and tok == bos:  # a document starts here: new segment, position 0
                seg, pos = seg + 1, 0
            assert (segments[i].item(), positions[i].item()) == (seg, pos), (g, i)
            pos += 1
            # Only the end of a document has no target inside its own document.
            assert labels[i].item() == (IGNORE_INDEX if tok == eos else window[i + 1]), (g, i)
    # Some row crosses a document boundary, or the checks above tested nothing interesting.
    assert any(int(loader.row(g)[3].max()) > 0 for g in range(loader.num_rows))


def test_unpacked_rows_hold_one_document_with_padding_ignored(corpus):
    S = 16
    loader = build_data_loader(_cfg(seq_len=S, source="text", path=str(corpus), pack_documents=False), vocab_size=300)
    batch = next(loader)
    assert batch.positions is None and batch.segment_ids is None
    rows = [loader.row(g) for g in range(loader.num_rows)]
    for tokens, labels, _, _ in rows:
        assert int((tokens == 256).sum()) <= 1 and (tokens[0] == 256 or 256 not in tokens.tolist())
        valid = labels != IGNORE_INDEX
        n = int(valid.sum())
        assert valid[:n].all()  # targets first, padding after
        assert torch.equal(labels[: n - 1], tokens[1:n])
    # Each document's text comes back from its rows in order (overlap of one token).
    text = []
    for tokens, labels, _, _ in rows:
        n = int((labels != IGNORE_INDEX).sum())
        if tokens[0] == 256:
            text.append([])
        text[-1].extend((tokens[:n].tolist() if not text[-1] else tokens[1:n].tolist()) + [labels[n - 1].item()])
    assert [bytes(t for t in d if t < 256).decode() for d in text] == PARAGRAPHS


# ---- errors ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make_path,message",
    [
        (lambda tmp: "", "data.path is empty"),
        (lambda tmp: str(tmp / "missing"), "does not exist"),
        (lambda tmp: str(tmp), "is an empty folder"),
        (lambda tmp: (tmp / "x.md").write_text("hi") and str(tmp), "holds no .txt files"),
        (lambda tmp: (tmp / "x.txt").write_text("\n \n\n") and str(tmp), "contains no text"),
        (lambda tmp: (tmp / "x.txt").write_text("tiny") and str(tmp), "fewer than one global batch"),
    ],
)
def test_bad_text_input_raises_config_error(tmp_path, make_path, message):
    with pytest.raises(ConfigError, match=message):
        build_data_loader(_cfg(source="text", path=make_path(tmp_path)), vocab_size=300)


def test_vocab_too_small_names_both_sizes(corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"vocab_size >= 258 .* model's vocab_size is 200"):
        build_data_loader(_cfg(source="text", path=str(corpus)), vocab_size=200)
    cfg = _cfg(source="text", path=str(corpus), tokenizer="bpe", bpe_vocab_size=1024, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match=r"bpe_vocab_size = 1024 exceeds the model's vocab_size = 512"):
        build_data_loader(cfg, vocab_size=512)
    assert not (tmp_path / "c").exists()  # refused before spending time on training
    cfg.data.bpe_vocab_size = 100
    with pytest.raises(ConfigError, match=r"bpe_vocab_size = 100 is below 258"):
        build_data_loader(cfg, vocab_size=512)
