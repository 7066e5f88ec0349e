"""Tokenizers: raw bytes, a byte-level BPE trained on the corpus, or the model's own (hf_tokenizer.py).

All expose the same small surface (`encode`, `decode`, `bos_id`, `eos_id`, `add_bos`,
`vocab_size`) so the loaders do not care which one they hold.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from titan_core.config.loader import ConfigError
from titan_core.data.hf_tokenizer import load_hf_tokenizer
from titan_core.runtime.files import atomic_write_text

# Bumped when the way a BPE is trained changes, so stale caches are not reused.
_BPE_FORMAT = "bpe-v1"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"


class ByteTokenizer:
    """Ids 0-255 are the UTF-8 bytes of the text; 256 is BOS and 257 is EOS."""

    bos_id = 256
    eos_id = 257
    add_bos = True
    vocab_size = 258
    key = "byte"
    from_cache = False  # nothing to train or cache; kept for a uniform surface

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # Specials have no bytes; dropping them makes decode(encode(t)) == t for any text.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BpeTokenizer:
    """A `tokenizers` byte-level BPE; `from_cache` says whether it was loaded rather than trained."""

    def __init__(self, tok, *, from_cache: bool, path: Path):
        self._tok = tok
        self.from_cache = from_cache
        self.path = path
        self.bos_id = tok.token_to_id(BOS_TOKEN)
        self.eos_id = tok.token_to_id(EOS_TOKEN)
        self.vocab_size = tok.get_vocab_size()
        self.add_bos = True
        self.key = path.stem  # the corpus digest it was trained on

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [enc.ids for enc in self._tok.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def corpus_key(texts: list[str], vocab_size: int) -> str:
    """Cache key of a BPE: the format version, the vocab size and every file's contents in order."""
    h = hashlib.sha256(f"{_BPE_FORMAT}:{vocab_size}".encode())
    for text in texts:
        data = text.encode("utf-8")
        # Length prefix so moving text across a file boundary changes the key.
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:24]


def train_bpe(docs: list[str], vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer` of at most `vocab_size` entries trained on `docs`,
    with BOS_TOKEN and EOS_TOKEN among its special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # lazy: the Rust extension, BPE only

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        # The full byte alphabet up front: any text encodes, even bytes unseen in training.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def load_or_train_bpe(file_texts: list[str], docs: list[str], vocab_size: int, cache_dir: str | Path) -> BpeTokenizer:
    """The BPE for this corpus: loaded from `cache_dir` when cached, else trained and cached.

    The cache file is written to a temporary name and renamed, so a crashed run never
    leaves a half-written tokenizer that a later run would load.
    """
    from tokenizers import Tokenizer  # lazy: the Rust extension loads only when a BPE is asked for

    min_vocab = 256 + 2  # the byte alphabet plus the two specials
    if vocab_size < min_vocab:
        raise ConfigError(f"data.bpe_vocab_size = {vocab_size} is below {min_vocab} (256 byte symbols + BOS + EOS)")
    path = Path(cache_dir) / f"bpe-{corpus_key(file_texts, vocab_size)}.json"
    if path.is_file():
        return BpeTokenizer(Tokenizer.from_file(str(path)), from_cache=True, path=path)
    tok = train_bpe(docs, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, tok.to_str(pretty=True))
    return BpeTokenizer(tok, from_cache=False, path=path)


def build_tokenizer(
    kind: str,
    *,
    model_vocab_size: int,
    bpe_vocab_size: int = 0,
    cache_dir: str | Path = "",
    file_texts: list[str] | None = None,
    docs: list[str] | None = None,
    tokenizer_path: str = "",
):
    """The tokenizer named by `data.tokenizer`, checked to emit only ids below the model's vocab.

    `file_texts` / `docs`: the whole corpus, which a BPE is trained on (None: a streamed
    corpus, which cannot train one). `tokenizer_path`: the hf tokenizer's file or folder.
    """
    if kind == "hf":
        return load_hf_tokenizer(tokenizer_path, model_vocab_size=model_vocab_size)
    if kind == "byte":
        tok = ByteTokenizer()
        if tok.vocab_size > model_vocab_size:
            raise ConfigError(
                f"the byte tokenizer needs vocab_size >= {tok.vocab_size} (256 bytes + BOS + EOS) "
                f"but the model's vocab_size is {model_vocab_size}"
            )
        return tok
    if kind == "bpe":
        if file_texts is None or docs is None:
            raise ConfigError(
                "data.tokenizer = 'bpe' is trained on the whole corpus in memory, which a streamed data.source = "
                "'dataset' never holds: use data.tokenizer = 'hf' (the model's own tokenizer) or 'byte'"
            )
        # Checked before training: no point spending the time on a tokenizer we must reject.
        if bpe_vocab_size > model_vocab_size:
            raise ConfigError(
                f"data.bpe_vocab_size = {bpe_vocab_size} exceeds the model's vocab_size = {model_vocab_size}: "
                "lower data.bpe_vocab_size or enlarge the model's vocabulary"
            )
        tok = load_or_train_bpe(file_texts, docs, bpe_vocab_size, cache_dir)
        if tok.vocab_size > model_vocab_size:  # a cache edited by hand, or a trainer that overshoots
            raise ConfigError(
                f"the BPE tokenizer at {tok.path} has {tok.vocab_size} ids but the model's vocab_size is {model_vocab_size}"
            )
        return tok
    raise ConfigError(f"data.tokenizer '{kind}' is not one of byte, bpe, hf")
