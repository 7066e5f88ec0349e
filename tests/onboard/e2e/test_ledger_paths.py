"""ledger_paths, the climbs' check that every file a ledger names is on disk: a per-rank name is a
pattern some rank's file must match, and a missing path's report carries the string it was named in."""

import json

import pytest
from ledger_paths import assert_every_named_path_exists


def _workspace(tmp_path, text: str):
    entry = {"rung": "simple_fsdp", "attempt": 1, "details": {"fsdp2_failure": text}}
    (tmp_path / "ladder.json").write_text(json.dumps({"attempts": [entry]}))
    return tmp_path


def test_a_per_rank_log_counts_once_some_ranks_file_is_there_and_a_missing_one_shows_its_report(tmp_path):
    logs = tmp_path.resolve() / "runs" / "logs"
    ws = _workspace(tmp_path, f"rank 1 exited with code 1: RuntimeError: boom; each rank's output: {logs}/rank_<r>.log")
    with pytest.raises(AssertionError, match="RuntimeError: boom"):
        assert_every_named_path_exists(ws)
    logs.mkdir(parents=True)
    (logs / "rank_1.log").write_text("")
    assert assert_every_named_path_exists(ws) == 1
