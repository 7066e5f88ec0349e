"""Local text files -> documents -> token rows, packed or one document per row.

A *document* is a paragraph: text separated from the next by a blank line (a file with
no blank line is one document). Paragraphs rather than whole files so that even a single
file yields many documents to pack. Each document is tokenised as [BOS] + text + EOS.

The row layouts (packed with segment ids, or each document cut into padded rows of its
own) are packing.py's, which the streaming dataset loader (dataset.py) shares.

The corpus is read and tokenised in memory: this loader is meant for small local
corpora (tests, demos, short check runs); data.source = 'dataset' streams large ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Data
from titan_core.data.base import RowLoader
from titan_core.data.coverage import Plan, check_epochs
from titan_core.data.packing import document_pieces, document_tokens, packed_row, padded_row
from titan_core.data.tokenizer import build_tokenizer, corpus_key

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def find_text_files(path: str, *, what: str = "data.path") -> list[Path]:
    """The file at `path`, or every *.txt under the folder `path` (recursively, sorted); `what` names
    the field the path came from, for the refusal."""
    if not path:
        raise ConfigError(f"{what} is empty: data.source = 'text' needs a .txt file or a folder of them")
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{what} '{path}' does not exist")
    if p.is_file():
        return [p]
    files = sorted(f for f in p.rglob("*.txt") if f.is_file())
    if not files:
        holds = "is an empty folder" if not any(p.iterdir()) else "holds no .txt files"
        raise ConfigError(f"{what} '{path}' {holds}")
    return files


def read_texts(files: list[Path]) -> list[str]:
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"data file '{f}' is not UTF-8 text ({e.reason} at byte {e.start})") from None
    return texts


def split_documents(text: str) -> list[str]:
    """Blank-line separated paragraphs, without their surrounding newlines; blank ones dropped."""
    return [p.strip("\n") for p in _PARAGRAPH_BREAK.split(text) if p.strip()]


class TextLoader(RowLoader):
    """Rows of tokenised local text; see the module docstring for the layout."""

    def __init__(self, data: Data, *, vocab_size: int, plan: Plan | None = None, **kw):
        super().__init__(**kw)
        files = find_text_files(data.path)
        texts = read_texts(files)
        docs = [d for t in texts for d in split_documents(t)]
        if not docs:
            raise ConfigError(f"data.path '{data.path}' contains no text (only blank files or whitespace)")
        self.tokenizer = build_tokenizer(
            data.tokenizer,
            model_vocab_size=vocab_size,
            bpe_vocab_size=data.bpe_vocab_size,
            cache_dir=data.cache_dir,
            file_texts=texts,
            docs=docs,
            tokenizer_path=data.tokenizer_path,
        )
        self.packed = data.pack_documents
        self.num_documents = len(docs)
        self._identity_dict = {
            "source": "text", "corpus": corpus_key(texts, 0), "tokenizer": data.tokenizer,
            "tokenizer_vocab": self.tokenizer.vocab_size, "packed": self.packed, "batch_size": self.batch_size,
            "seq_len": self.seq_len, "dp_rank": self.dp_rank, "dp_world": self.dp_world,
            "repeat_batch": self.repeat_batch,
        }  # fmt: skip
        self._build_stream(docs, vocab_size)
        need = self.batch_size * self.dp_world
        if self.num_rows < need:
            raise ConfigError(
                f"data.path '{data.path}' gives {self.num_rows} rows of seq_len + 1 = {self.seq_len + 1} tokens, "
                f"fewer than one global batch (batch_size {self.batch_size} x {self.dp_world} ranks = {need}): "
                "add text or lower training.batch_size / training.seq_len"
            )
        if plan is not None and not self.repeat_batch:  # rows wrap into the next epoch: bounded by data.max_epochs
            tokens = int(self.stream.numel())
            has = f"{self.num_documents:,} document{'s' if self.num_documents != 1 else ''}, {tokens:,} tokens"
            check_epochs(self.num_rows, plan, data.max_epochs, where=f"data.path '{data.path}'", has=has,
                         dp_world=self.dp_world)  # fmt: skip

    def _build_stream(self, docs: list[str], vocab_size: int) -> None:
        tok = self.tokenizer
        encoded = document_tokens(tok, docs)
        lengths = torch.tensor([len(ids) for ids in encoded])
        flat = [i for ids in encoded for i in ids]
        self.stream = torch.tensor(flat, dtype=torch.int64)
        biggest = int(self.stream.max())
        if biggest >= vocab_size:
            raise ConfigError(f"the tokenizer emitted id {biggest}, outside the model's vocab_size = {vocab_size}")
        self.doc_ids = torch.repeat_interleave(torch.arange(len(docs)), lengths)
        self.doc_starts = torch.cumsum(lengths, 0) - lengths
        self.doc_ends = self.doc_starts + lengths
        S = self.seq_len
        if self.packed:
            self.num_rows = max(0, (len(flat) - 1) // S)
        else:
            self.chunks = [
                piece
                for a, b in zip(self.doc_starts.tolist(), self.doc_ends.tolist())
                for piece in document_pieces(a, b, S)
            ]
            self.num_rows = len(self.chunks)

    def row(self, g: int):
        S = self.seq_len
        g %= self.num_rows  # wrap into the next epoch, same order
        if not self.packed:
            s, e = self.chunks[g]
            return padded_row(self.stream[s:e], S, self.tokenizer.eos_id)
        return packed_row(self.stream[g * S : g * S + S + 1], self.doc_ids[g * S : g * S + S + 1])

    def _identity(self) -> dict[str, Any]:
        return self._identity_dict
