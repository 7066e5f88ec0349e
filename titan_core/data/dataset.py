"""`data.source = "dataset"`: local JSONL / JSON / Parquet / text files streamed through `datasets`.

Files and rows: dataset_files.py. Each data-parallel rank reads its own shard of the rows
(`datasets.distributed.split_dataset_by_node`: whole files per rank when their count divides
by the ranks, else every `dp_world`-th row), so the ranks see disjoint documents whose union
is the corpus. Documents are tokenized as they are read and laid out by packing.py: packed
(`data.pack_documents`, EOS between documents, segment ids), or each document cut into padded
rows of its own. Micro-batch k of a rank is rows k*B .. k*B + B - 1 of *its own* stream (the
global-row contract of base.py cannot hold for a stream that is not random access: a run on
another number of data-parallel ranks reads other rows, and its resume is refused).

Chat (`data.format = "chat"`): each row's `messages` go through the chat template (chat.py)
and only assistant tokens are targets; every other label is -100, the index the loss and the
global-token mean already skip (token_mean.py). Packed, conversations are packed like
documents (segment ids keep attention inside each); not packed, one conversation per row,
truncated to seq_len + 1 tokens and padded with EOS.

At the end of this rank's rows the stream starts over (an epoch), in the same order; the
leftover tokens carry into it. Bad rows (a broken JSON line, the field missing, null, not a
string or empty, a malformed conversation) are skipped and counted by reason in the first
pass (later epochs meet the same rows): a log line whenever the count reaches a power of two,
the counts in the state, in `report()` and in the line `report_data` logs at the end of a run.

Resume: the state holds the position in the files (`datasets`' own state_dict of the
iterator, the rows read and documents made), the tokens read but not yet emitted, and the
counts, so a resumed run continues the same token stream bit for bit. Nothing is read ahead
of what the next row needs beyond one small group of rows, which the state holds as tokens.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import weakref
from collections import Counter
from typing import Any

from titan_core.config.loader import ConfigError
from titan_core.config.sections import Data
from titan_core.data.base import Batch, RowLoader, stack_rows
from titan_core.data.chat import BadRow, check_messages, conversation_tokens, template_for
from titan_core.data.coverage import Plan, check_epochs, check_valid_fraction, epochs_text
from titan_core.data.dataset_files import (
    BAD_REASONS, PROBE_ROWS, SKIP, find_data_files, open_dataset, probe, row_value, text_of,
)  # fmt: skip
from titan_core.data.packing import PackedStream, PieceStream, document_tokens
from titan_core.data.tokenizer import build_tokenizer

log = logging.getLogger("titan_core.data")

_LIVE: weakref.WeakSet = weakref.WeakSet()
"""Loaders whose row iterator may be open: closed at exit while the modules their readers use
still exist (a parquet reader finalized later prints an ignored exception)."""


@atexit.register
def _close_all() -> None:
    for loader in list(_LIVE):
        loader._close()


_GROUP = 64
"""Rows read and tokenized together (one encode_batch) when the stream needs more tokens ..."""
_GROUP_CHARS = 1 << 16
"""... or fewer once their text reaches this many characters: what was read ahead is saved in the state."""
_MEASURE_CHARS = 1 << 20
"""Text read at most before step 1 to find one pass's length (with PROBE_ROWS rows): about a second of tokenizing."""


class DatasetLoader(RowLoader):
    """This rank's micro-batches of a streamed corpus; see the module docstring."""

    endless = True
    """Start over at the end of the rows (training). False: `next` raises StopIteration once the
    rows run out (a held-out set read once); the last, incomplete row is dropped."""

    def __init__(self, data: Data, *, vocab_size: int, plan: Plan | None = None, **kw):
        super().__init__(**kw)
        self.plan = None if self.repeat_batch else plan
        """The rows this rank is asked for over the run (None: a held-out set, or one repeated batch):
        what data.max_epochs bounds."""
        self.min_valid_fraction, self.max_epochs = data.min_valid_fraction, data.max_epochs
        self.chat = data.format == "chat"
        self.files = find_data_files(data.path)
        if self.chat and data.tokenizer != "hf":
            raise ConfigError(
                f"data.format = 'chat' needs data.tokenizer = 'hf': the chat template writes the model's own special "
                f"tokens, which the '{data.tokenizer}' tokenizer does not have"
            )
        if self.chat and self.files.kind == "text":
            raise ConfigError(
                f"data.format = 'chat' reads a 'messages' column: the .txt files {self.files.where()} have none"
            )
        self.column = "messages" if self.chat else data.field
        self.tokenizer = build_tokenizer(
            data.tokenizer, model_vocab_size=vocab_size, tokenizer_path=data.tokenizer_path
        )
        self.template = template_for(data.chat_template, self.tokenizer) if self.chat else None
        self.packed = data.pack_documents
        seen = probe(self.files, self.column, chat=self.chat)  # the same first rows on every rank: one verdict
        check_valid_fraction(seen.valid, seen.rows, self.min_valid_fraction, where=seen.where(self.files),
                             bad=_reasons(seen.bad))  # fmt: skip
        self._base = open_dataset(self.files, self.column)
        template_key = hashlib.sha256(self.template.source.encode()).hexdigest()[:16] if self.template else ""
        self._identity_dict = {
            "source": "dataset", "files": self.files.digest(), "num_files": len(self.files.files),
            "column": self.column, "format": data.format, "chat_template": template_key,
            "tokenizer": data.tokenizer, "tokenizer_key": self.tokenizer.key, "packed": self.packed,
            "batch_size": self.batch_size, "seq_len": self.seq_len, "dp_rank": self.dp_rank,
            "dp_world": self.dp_world, "shard": f"{self.dp_rank}/{self.dp_world}", "repeat_batch": self.repeat_batch,
        }  # fmt: skip
        self._first: Batch | None = None
        self._it = None
        self._quiet = False
        self.pass_rows: float | None = None
        """Rows one pass over this rank's shard makes (None until a pass has ended); with pass_tokens and
        pass_documents, what the bounds of coverage.py judge and what the epochs are counted in."""
        self.pass_tokens = self.pass_documents = 0
        self._reset()
        _LIVE.add(self)
        if self.plan is not None and self.max_epochs:
            self._measure_pass()

    # ---- position --------------------------------------------------------------------
    def _new_stream(self):
        if self.packed:
            return PackedStream(self.seq_len, with_target=self.chat)
        return PieceStream(self.seq_len, pad_id=self.tokenizer.eos_id, with_target=self.chat, truncate=self.chat)

    def _reset(self) -> None:
        """Back to the start of this rank's rows."""
        self.epoch = 0
        self.rows_read = 0
        """Rows of this rank read in this epoch (bad and blank ones included)."""
        self.documents = 0
        """Documents (or conversations) that went into the stream, over every epoch."""
        self.epoch_documents = 0
        self.epoch_rows = 0.0
        """Rows the documents of this epoch make (packing.py's `add`)."""
        self.epoch_tokens = 0
        self.rows_taken = 0
        """Rows emitted, over every epoch: the epochs done are rows_taken / pass_rows."""
        self.chars_read = 0
        self.bad: Counter[str] = Counter()
        self._stream = self._new_stream()
        self._open("")

    def _measure_pass(self) -> None:
        """Before step 1, so that a corpus too small for the plan is refused before anything is written
        (and the epochs of a run shorter than one pass are known): read this rank's rows until one pass
        ends (`_next_epoch` then judges it) or PROBE_ROWS rows or _MEASURE_CHARS characters were read,
        then rewind. A larger shard is judged when the run's own first pass ends: a shard too small for
        the plan ends its first pass within 1 / data.max_epochs of the run."""
        self._quiet = True  # the run reads these rows again and logs what it finds then
        try:
            while self.epoch == 0 and self.rows_read < PROBE_ROWS and self.chars_read < _MEASURE_CHARS:
                self._fill()
        finally:
            self._quiet = False
            self._reset()

    def _open(self, position: str) -> None:
        """This rank's shard of the rows, at the start of the epoch ("") or at a saved position
        (datasets' state_dict as JSON)."""
        from datasets.distributed import split_dataset_by_node  # lazy: the [hf] extra (datasets), seconds to import

        self._close()
        self._ds = split_dataset_by_node(self._base, rank=self.dp_rank, world_size=self.dp_world)
        if position:
            self._ds.load_state_dict(json.loads(position))
        self._position = position
        """Where the iterator was opened: the position until it has read a row."""
        self._it = None  # opened on the first read: a fresh loader costs no file access

    def _close(self) -> None:
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()

    def _read(self):
        """The next raw row of this rank, or None at the end of the epoch."""
        if self._it is None:
            self._it = iter(self._ds)
        try:
            example = next(self._it)
            self._position = None  # moved: the position is now datasets' own state
            return example
        except StopIteration:
            return None
        except Exception as e:  # the builders raise their own errors for a file they cannot parse
            raise ConfigError(f"data file {self.files.where()} cannot be read: {e}") from None

    # ---- reading ---------------------------------------------------------------------
    def _count_bad(self, reason: str) -> None:
        if self.epoch > 0:
            return  # the same rows again: counted in the first pass
        self.bad[reason] += 1
        n = sum(self.bad.values())
        if n & (n - 1) == 0 and not self._quiet:  # 1, 2, 4, 8, ...: the log stays short however many rows are bad
            log.warning("data: %s so far; skipped, not trained on", self._bad_text())

    def _bad_text(self) -> str:
        n = sum(self.bad.values())
        where = f" (data-parallel rank {self.dp_rank})" if self.dp_world > 1 else ""
        return f"{n} bad row{'s' if n != 1 else ''} in {self.files.where()}{where} ({_reasons(self.bad)})"

    def _fill(self) -> bool:
        """Read up to _GROUP usable rows into the stream; False at the end of a non-endless epoch."""
        values, chars = [], 0
        while len(values) < _GROUP and chars < _GROUP_CHARS:
            example = self._read()
            if example is None:
                if values:
                    break
                if not self._next_epoch():
                    return False
                continue
            self.rows_read += 1
            try:
                value = row_value(example, self.files.kind, self.column)
                if value is not SKIP:
                    values.append(check_messages(value) if self.chat else text_of(value))
                    chars += len(values[-1]) if not self.chat else sum(len(m["content"]) for m in values[-1])
            except BadRow as bad:
                self._count_bad(bad.reason)
        self.chars_read += chars
        docs, targets = self._tokenize(values)
        self.documents += len(docs)
        self.epoch_documents += len(docs)
        self.epoch_tokens += sum(len(d) for d in docs)
        self.epoch_rows += self._stream.add(docs, targets)
        return True

    def _tokenize(self, values: list) -> tuple[list[list[int]], list[list[bool]] | None]:
        tok = self.tokenizer
        if not self.chat:
            return document_tokens(tok, values), None
        docs, targets = [], []
        for messages in values:
            try:
                ids, target = conversation_tokens(tok, self.template, messages)
                if not self.packed and not any(target[1 : self.seq_len + 1]):
                    raise BadRow("truncated")  # one row per conversation, and its window trains on nothing
            except BadRow as bad:
                self._count_bad(bad.reason)
                continue
            docs.append(ids)
            targets.append(target)
        return docs, targets

    def _next_epoch(self) -> bool:
        """Start this rank's rows over (False: not endless, so the rows have ended)."""
        if self.epoch_documents == 0:
            raise ConfigError(
                f"data file {self.files.where()} gave data-parallel rank {self.dp_rank} of {self.dp_world} no usable "
                f"document in a whole pass over its {self.rows_read} rows"
                + (f" ({self._bad_text()})" if self.bad else "")
            )
        if self.epoch == 0 and not math.isnan(self.epoch_rows):
            self.pass_rows, self.pass_tokens = self.epoch_rows, self.epoch_tokens
            self.pass_documents = self.epoch_documents
            if self.plan is not None:
                self._judge_pass()
        if not self.endless:
            return False
        self.epoch += 1
        self.rows_read = 0
        self.epoch_documents = 0
        self.epoch_rows, self.epoch_tokens = 0.0, 0
        self._open("")
        return True

    def _judge_pass(self) -> None:
        """A whole pass over this rank's shard against data.min_valid_fraction and data.max_epochs."""
        shard = f" (data-parallel rank {self.dp_rank} of {self.dp_world}'s shard)" if self.dp_world > 1 else ""
        where = f"data file {self.files.where()}{shard}"
        rows = self.pass_documents + sum(self.bad.values())
        check_valid_fraction(self.pass_documents, rows, self.min_valid_fraction, where=where, bad=_reasons(self.bad))
        has = f"{self.pass_documents:,} document{'s' if self.pass_documents != 1 else ''}, {self.pass_tokens:,} tokens"
        check_epochs(self.pass_rows, self.plan, self.max_epochs, where=where, has=has)

    def _row(self):
        while not self._stream.ready():
            if not self._fill():
                raise StopIteration
        self.rows_taken += 1
        return self._stream.take()

    def _batch(self) -> Batch:
        return stack_rows([self._row() for _ in range(self.batch_size)])

    # ---- iteration -------------------------------------------------------------------
    def batch_at(self, k: int) -> Batch:
        """Micro-batch `k` of this rank, without moving the iterator (reads the stream from its start)."""
        saved = self.state_dict()
        try:
            self._reset()
            for _ in range(k):
                self._batch()
            return self._batch()
        finally:
            self.load_state_dict(saved)

    def __next__(self) -> Batch:
        if self.repeat_batch:
            if self._first is None:
                self._first = self.batch_at(0)
            batch = self._first
        else:
            batch = self._batch()
        self.step += 1
        return batch

    # ---- resume ----------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        return self._identity_dict

    def state_dict(self) -> dict[str, Any]:
        # datasets' position as JSON text: the checkpoint's per-rank state is read back with weights_only
        position = self._position if self._position is not None else json.dumps(self._ds.state_dict())
        return {
            **super().state_dict(), "epoch": self.epoch, "rows_read": self.rows_read, "documents": self.documents,
            "epoch_documents": self.epoch_documents, "bad": dict(self.bad), "dataset_position": position,
            "epoch_rows": self.epoch_rows, "epoch_tokens": self.epoch_tokens, "rows_taken": self.rows_taken,
            "pass": None if self.pass_rows is None else [self.pass_rows, self.pass_tokens, self.pass_documents],
            **self._stream.state(),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self._identity_dict["shard"]
        if state.get("shard", mine) != mine:
            raise ConfigError(
                f"cannot resume the dataset stream: it was read as data-parallel rank {state['shard']} (rank/ranks), "
                f"this run's is {mine}; each rank streams its own shard of the files, so resume with the same "
                "number of data-parallel ranks"
            )
        super().load_state_dict(state)
        self.epoch = int(state["epoch"])
        self.rows_read = int(state["rows_read"])
        self.documents = int(state["documents"])
        self.epoch_documents = int(state["epoch_documents"])
        # a state saved before the rows of an epoch were counted: this epoch's are unknown (nan), not judged
        self.epoch_rows, self.epoch_tokens = float(state.get("epoch_rows", math.nan)), int(state.get("epoch_tokens", 0))
        self.rows_taken = int(state.get("rows_taken", 0))
        if state.get("pass") is not None:
            rows, self.pass_tokens, self.pass_documents = state["pass"]
            self.pass_rows = float(rows)
        self.bad = Counter(state["bad"])
        self._stream = self._new_stream()
        self._stream.load(state)
        self._open(state["dataset_position"])

    # ---- report ----------------------------------------------------------------------
    def epochs(self) -> float | None:
        """Passes over this rank's shard the emitted rows make (1.6: one and most of a second); None while
        the first pass has not ended, so that its length is unknown."""
        return None if not self.pass_rows else self.rows_taken / self.pass_rows

    def report(self) -> dict[str, Any]:
        """What this rank read: the epoch it is in, the epochs done (a fraction, None before a pass
        ended), rows, documents and bad rows by reason (BAD_REASONS' keys)."""
        return {"epoch": self.epoch, "epochs": self.epochs(), "rows_read": self.rows_read,
                "documents": self.documents, "bad_rows": sum(self.bad.values()), "bad": dict(self.bad)}  # fmt: skip

    def summary_line(self) -> str:
        bad = self._bad_text() if self.bad else f"no bad row in {self.files.where()}"
        return f"data: {self.documents} documents read, {epochs_text(self.epochs())} trained on; {bad}"


def _reasons(bad: Counter) -> str:
    """Bad rows by reason, as the report says them: 'broken JSON line: 2, empty: 1'."""
    return ", ".join(f"{BAD_REASONS[r]}: {c}" for r, c in sorted(bad.items()))


def report_data(loader) -> dict[str, Any]:
    """At the end of a run: the loader's report (empty for a loader without one), and a log line
    when it skipped bad rows."""
    if not isinstance(loader, DatasetLoader):
        return {}
    if loader.bad:
        log.warning("%s", loader.summary_line())
    return loader.report()
