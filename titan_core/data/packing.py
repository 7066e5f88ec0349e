"""Token rows from documents, shared by the in-memory text loader and the streaming dataset loader.

A document's tokens are `[BOS] + text + EOS` (BOS when the tokenizer adds one); a chat
conversation is its template's rendering as it stands, with a per-token `target` flag (an
assistant token: trained on).

Packed: documents are concatenated into one stream and row g is `stream[g*S : g*S + S + 1]`
(rows overlap by one token, so every token is a target exactly once). Within a row,
`segment_ids` count documents from 0 and `positions` restart at 0 where a document starts
(and at the row start: a document continued from the previous row cannot see its beginning
anyway). The label of a document's last token (its next token is the next document's) and of
a token whose next token is not a target is -100. `packed_row` makes one row; `PackedStream`
makes them one after another from documents appended as they are read.

Not packed: each piece of at most S + 1 tokens is a row of its own, padded with EOS whose
labels are -100 (`padded_row`); a text document is cut into pieces with the same one-token
overlap (`document_pieces`), a conversation is truncated to its first piece.
"""

from __future__ import annotations

from typing import Any

import torch

from titan_core.data.base import IGNORE_INDEX

Row = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def document_tokens(tok, texts: list[str]) -> list[list[int]]:
    """Each text as a document goes into the stream: BOS (if the tokenizer adds one), its ids, EOS
    (encoded as one batch where the tokenizer can)."""
    encoded = tok.encode_batch(texts) if hasattr(tok, "encode_batch") else [tok.encode(t) for t in texts]
    return [([tok.bos_id] if tok.add_bos else []) + list(ids) + [tok.eos_id] for ids in encoded]


def packed_row(seq: torch.Tensor, docs: torch.Tensor, target: torch.Tensor | None = None) -> Row:
    """Row of a packed stream from its S + 1 tokens `seq`, their document numbers `docs`
    (non-decreasing, one apart between neighbours) and, optionally, which tokens are targets."""
    S = seq.numel() - 1
    keep = docs[1:] == docs[:-1]
    if target is not None:
        keep &= target[1:]
    labels = torch.where(keep, seq[1:], IGNORE_INDEX)
    # document numbers increase by one per document, so subtracting the first numbers the row's 0, 1, 2, ...
    segment_ids = docs[:-1] - docs[0]
    idx = torch.arange(S)
    starts = torch.ones(S, dtype=torch.bool)
    starts[1:] = docs[1:S] != docs[: S - 1]
    positions = idx - torch.cummax(torch.where(starts, idx, 0), 0).values
    return seq[:-1].clone(), labels, positions, segment_ids


def document_pieces(start: int, end: int, seq_len: int) -> list[tuple[int, int]]:
    """[s, e) ranges of the rows of a document at [start, end) of a stream: piece j starts at
    start + j*S and holds at least one (input, target) pair."""
    return [(c, min(c + seq_len + 1, end)) for c in range(start, end - 1, seq_len)]


def padded_row(piece: torch.Tensor, seq_len: int, pad_id: int, target: torch.Tensor | None = None) -> Row:
    """Row of one piece of 2..S+1 tokens, padded with `pad_id` (labels -100 past the piece)."""
    n = piece.numel()
    full = torch.full((seq_len + 1,), pad_id, dtype=torch.int64)
    full[:n] = piece
    labels = full[1:].clone()
    labels[n - 1 :] = IGNORE_INDEX
    if target is not None:
        labels[: n - 1][~target[1:n]] = IGNORE_INDEX
    return full[:-1], labels, None, None


def _flat(docs: list[list[int]]) -> torch.Tensor:
    return torch.tensor([i for d in docs for i in d], dtype=torch.int64)


def _flat_target(targets: list[list[bool]] | None, docs: list[list[int]]) -> torch.Tensor | None:
    if targets is None:
        return None
    return torch.tensor([t for ts in targets for t in ts], dtype=torch.bool).reshape(sum(len(d) for d in docs))


class PackedStream:
    """The packed layout over documents that arrive over time: `add` appends them, `take`
    returns the next row once `ready`. What was added but not yet emitted is its `state`."""

    def __init__(self, seq_len: int, *, with_target: bool):
        self.seq_len = seq_len
        self.with_target = with_target
        self.tokens = torch.empty(0, dtype=torch.int64)
        self.docs = torch.empty(0, dtype=torch.int64)
        """Each buffered token's document number (counted over the whole stream)."""
        self.target = torch.empty(0, dtype=torch.bool) if with_target else None
        self.next_doc = 0

    def add(self, docs: list[list[int]], targets: list[list[bool]] | None = None) -> float:
        """Append documents; returns the rows they make (their tokens / seq_len, a fraction of a row counts)."""
        if not docs:
            return 0.0
        numbers = torch.repeat_interleave(
            torch.arange(self.next_doc, self.next_doc + len(docs)), torch.tensor([len(d) for d in docs])
        )
        self.next_doc += len(docs)
        self.tokens = torch.cat([self.tokens, _flat(docs)])
        self.docs = torch.cat([self.docs, numbers])
        if self.target is not None:
            self.target = torch.cat([self.target, _flat_target(targets, docs)])
        return sum(len(d) for d in docs) / self.seq_len

    def ready(self) -> bool:
        return self.tokens.numel() >= self.seq_len + 1

    def take(self) -> Row:
        S = self.seq_len
        tgt = None if self.target is None else self.target[: S + 1]
        row = packed_row(self.tokens[: S + 1], self.docs[: S + 1], tgt)
        # the row's last token starts the next row (the one-token overlap)
        self.tokens, self.docs = self.tokens[S:], self.docs[S:]
        if self.target is not None:
            self.target = self.target[S:]
        return row

    def state(self) -> dict[str, Any]:
        out = {"buffer": self.tokens.clone(), "buffer_docs": self.docs.clone(), "next_doc": self.next_doc}
        if self.target is not None:
            out["buffer_target"] = self.target.clone()
        return out

    def load(self, state: dict[str, Any]) -> None:
        self.tokens, self.docs = state["buffer"].clone(), state["buffer_docs"].clone()
        self.next_doc = int(state["next_doc"])
        if self.target is not None:
            self.target = state["buffer_target"].clone()


class PieceStream:
    """The unpacked layout over documents that arrive over time: each document becomes its
    pieces (all of them, or with `truncate` only the first), each piece one padded row."""

    def __init__(self, seq_len: int, *, pad_id: int, with_target: bool, truncate: bool):
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.with_target = with_target
        self.truncate = truncate
        self.pieces: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def add(self, docs: list[list[int]], targets: list[list[bool]] | None = None) -> float:
        """Append documents; returns the rows they make (one per piece kept)."""
        before = len(self.pieces)
        for i, doc in enumerate(docs):
            ids = torch.tensor(doc, dtype=torch.int64)
            tgt = torch.tensor(targets[i], dtype=torch.bool) if targets is not None else None
            spans = document_pieces(0, len(doc), self.seq_len)
            for s, e in spans[:1] if self.truncate else spans:
                self.pieces.append((ids[s:e], None if tgt is None else tgt[s:e]))
        return float(len(self.pieces) - before)

    def ready(self) -> bool:
        return bool(self.pieces)

    def take(self) -> Row:
        piece, tgt = self.pieces.pop(0)
        return padded_row(piece, self.seq_len, self.pad_id, tgt)

    def state(self) -> dict[str, Any]:
        lengths = [p.numel() for p, _ in self.pieces]
        out = {
            "buffer": torch.cat([p for p, _ in self.pieces]) if self.pieces else torch.empty(0, dtype=torch.int64),
            "buffer_lengths": torch.tensor(lengths, dtype=torch.int64),
        }
        if self.with_target:
            out["buffer_target"] = (
                torch.cat([t for _, t in self.pieces]) if self.pieces else torch.empty(0, dtype=torch.bool)
            )
        return out

    def load(self, state: dict[str, Any]) -> None:
        lengths = state["buffer_lengths"].tolist()
        tokens = state["buffer"].clone().split(lengths)
        targets = state["buffer_target"].clone().split(lengths) if self.with_target else [None] * len(lengths)
        self.pieces = list(zip(tokens, targets))
