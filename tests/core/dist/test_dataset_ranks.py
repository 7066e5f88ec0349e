"""Streamed data on two gloo ranks (SimpleFSDP): each rank reads its own documents, together all
of them, and a run resumed from its checkpoint continues every rank's token stream bit for bit."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import _world
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/core: the tiny tokenizer and corpus helpers

from hf_data import doc_text, write_jsonl, write_tokenizer

from titan_core.data import load_hf_tokenizer

pytestmark = pytest.mark.whole_machine  # its ranks meet at every collective: the background climbs pause

DOCS = 20


def _args(root: Path) -> list[str]:
    tok = write_tokenizer(root / "tokenizer")
    corpus = write_jsonl(root / "corpus.jsonl", [{"text": doc_text(i)} for i in range(DOCS)], raw_lines={7: "{broken"})
    return [str(root / "out"), str(corpus), str(tok)]


JOB = _world.job("dataset", 2, Path(__file__).with_name("_data_worker.py"), _args, __file__)


@pytest.fixture(scope="module")
def ranks(request):
    """(the ranks' results, the tokenizer), from the session's one 2-rank launch (_world.py)."""
    res = _world.results(request, JOB)
    return res.ranks, load_hf_tokenizer(str(res.folder / "tokenizer"), model_vocab_size=512)


def _docs(tok, batches) -> set[int]:
    ids = [t for b in batches for row in b for t in row]
    return {int(m) for m in re.findall(r"\bdoc(\d+)\b", tok.decode(ids))}


def test_ranks_read_disjoint_documents_that_together_are_all(ranks):
    out, tok = ranks
    seen = [_docs(tok, r["straight"]["batches"]) for r in out]
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(DOCS))  # 4 steps are more than a pass over each rank's half
    bad = [r["straight"]["report"]["bad"] for r in out]
    assert sorted(bad, key=len) == [{}, {"broken_json": 1}]  # the broken line is one rank's row


def test_a_resumed_run_continues_every_ranks_stream(ranks):
    out, _ = ranks
    for r in out:
        assert r["resumed"]["resumed_from"] == 2 and len(r["resumed"]["batches"]) == 2
        assert r["resumed"]["batches"] == r["straight"]["batches"][2:]
        assert r["resumed"]["loss"] == r["straight"]["loss"][2:]
    assert out[0]["straight"]["batches"] != out[1]["straight"]["batches"]
