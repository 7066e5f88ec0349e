"""`onboard compat` climbs the real ladder engine: every cell is what the probe workspace's ledger
recorded (the failed criterion of a failed attempt, the rungs after it not reached); a Ctrl-C keeps
the rows that finished in the table files and `--resume` goes on from them; bad input exits 2.

A whole seven-rung climb takes minutes on 2 CPU cores, so the architectures here stop early (a
learning rate of 0 fails the eager gate, a time limit of seconds kills a probe, xlnet is not a causal LM); `make
compat` climbs the others (docs/COMPATIBILITY.md)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app

pytestmark = [pytest.mark.slow, pytest.mark.hf]
RUNGS = ["eager", "parity", "simple_fsdp", "compile", "graph_trainer", "kernels", "tuning"]


def compat(*args) -> list[str]:
    return [sys.executable, "-m", "onboard", "compat", *map(str, args)]


TAKES_CTRL_C = (
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
"""Python that execs its arguments with SIGINT neither ignored nor blocked, as a terminal's Ctrl-C
finds it, wherever this suite runs (a background job ignores it; a CI runner may block it)."""


def compat_here(*args):
    """`onboard compat` in this process (the probes still run in their own)."""
    return CliRunner().invoke(app, ["compat", *map(str, args)])


def test_a_failed_rung_shows_the_criterion_its_ledger_entry_failed(tmp_path):
    from onboard.compat import climb, scaffold

    ws, n_params = scaffold("llama", tmp_path)
    assert n_params == 106_816  # the tiny config: 2 layers, hidden 64, vocab 256
    # AdamW at lr 0 moves no weight, so the loss cannot fall: the eager gate fails on its own criterion
    ws.recipe_path.write_text(ws.recipe_path.read_text() + "\n[optimizer]\nlr = 0.0\n")
    steps = list(climb(ws))
    assert len(steps) == 1  # the climb stops at the first rung that does not pass
    cells = steps[-1]
    attempts = json.loads((ws.root / "ladder.json").read_text())["attempts"]
    assert [(e["rung"], e["status"]) for e in attempts] == [("eager", "failed")]
    bad = next(c for c in attempts[0]["criteria"] if not c["ok"])
    assert bad["name"] == "loss_falls"
    assert list(cells) == RUNGS
    eager = cells["eager"]
    assert eager["status"] == "fail" and eager["reason"].startswith(f"loss_falls: {bad['value']!r} (needs ")
    assert eager["seconds"] == round(attempts[0]["duration_s"], 1)
    assert all(cells[r] == {"status": "not_reached", "reason": "the eager rung failed"} for r in RUNGS[1:])


def test_ctrl_c_keeps_the_finished_rows_and_resume_goes_on(tmp_path):
    md, results = tmp_path / "COMPAT.md", tmp_path / "compat.json"
    files = ["--markdown", md, "--results", results]
    # xlnet is measured not to be a causal LM (not probed, in seconds); llama's climb takes minutes,
    # so the Ctrl-C lands while it runs whatever the machine's load
    proc = subprocess.Popen(
        [sys.executable, "-c", TAKES_CTRL_C, *compat("xlnet", "llama", "--json", *files)[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        if line.startswith("compat: [2/2] llama"):
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    r = json.loads(out)
    finished = (r["interrupted"], r["remaining"], r["rows"], list(r["not_probed"]))
    assert finished == ("llama", ["llama"], {}, ["xlnet"])
    assert json.loads(results.read_text()) == r  # the file holds what finished
    assert "**Partial**: interrupted while probing llama" in md.read_text()

    # resumed, llama probed anew under a time limit it cannot meet (it is still importing torch at
    # 3 s): the probe's whole process group is killed and the rung it was on fails with why
    again = compat_here("xlnet", "llama", "--json", *files, "--resume", "--timeout", "3")
    assert again.exit_code == 0, again.stderr[-2000:]
    assert "compat: [1/2] xlnet: kept from the results file" in again.stderr  # progress on stderr
    r = json.loads(again.stdout)
    assert (r["rungs"], r["requested"], r["probed"], r["remaining"], r["interrupted"]) == (RUNGS, 2, 1, [], None)
    assert r["not_probed"]["xlnet"].startswith("not a causal LM: XLNetLMHeadModel changes its logits at earlier")
    assert (r["not_causal"], r["counted"]) == (["xlnet"], 1)
    cells = r["rows"]["llama"]["cells"]
    assert cells["eager"] == {"status": "fail", "reason": "probe exceeded 3 s"} and r["rows"]["llama"]["seconds"] < 10
    assert all(cells[rung] == {"status": "not_reached", "reason": "the eager rung failed"} for rung in RUNGS[1:])
    assert r["passing"] == dict.fromkeys(RUNGS, 0) and json.loads(results.read_text()) == r
    text = md.read_text()
    assert "| model_type | " + " | ".join(RUNGS) + " |" in text
    assert "| llama | fail | " + " | ".join(["not reached"] * 6) + " |" in text
    assert "## Not probed" in text and "Partial" not in text
    assert "1 of them measured not to be causal LMs at all, so 1 counted" in text


def test_bad_input_exits_2_before_any_probe(tmp_path):
    unknown = compat_here("llama", "no_such_arch", "--json")
    assert unknown.exit_code == 2 and "no_such_arch" in json.loads(unknown.stdout)["error"]
    md = tmp_path / "COMPAT.md"
    no_file = compat_here("gemma3", "--resume", "--markdown", md, "--json")
    assert no_file.exit_code == 2 and "--resume needs --results" in json.loads(no_file.stdout)["error"]
    assert not md.exists()


def test_resume_refuses_a_results_file_of_another_transformers(tmp_path):
    results = tmp_path / "compat.json"
    results.write_text(json.dumps({"transformers": "0.0.1", "rungs": RUNGS, "rows": {}, "not_probed": {}}))
    other = compat_here("gemma3", "--results", results, "--resume", "--json")
    assert other.exit_code == 2 and "transformers 0.0.1" in json.loads(other.stdout)["error"]
    results.write_text("{not json")
    broken = compat_here("gemma3", "--results", results, "--resume", "--json")
    assert broken.exit_code == 2 and "is not a compat results file" in json.loads(broken.stdout)["error"]
