"""End to end on the llama3 debug workspace with the real eager rung: a failing gate, a
passing one, status, report, waive, staleness after editing recipe.toml, re-verification."""

import json
import math
import re
import statistics
from pathlib import Path

from typer.testing import CliRunner

from onboard.cli.app import app

runner = CliRunner()


def onboard(*args):
    return runner.invoke(app, [str(a) for a in args])


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def num_params(family: str, flavor: str, **overrides) -> int:
    """Parameters of the model the recipe builds (on meta: nothing allocated)."""
    from titan_core.models import build_meta, resolve_args

    return sum(p.numel() for p in build_meta(family, resolve_args(family, flavor, overrides)).parameters())


def test_eager_ladder_end_to_end(tmp_path):
    assert (
        onboard("new-model", "dbg", "--preset", "llama3/debugmodel", "--device", "cpu", "--dir", tmp_path).exit_code
        == 0
    )
    ws = tmp_path / "onboarding" / "dbg"
    recipe = ws / "recipe.toml"
    # keep the test fast: 2 of the 6 layers, 20 steps of 2 x 64 tokens
    edit(recipe, 'hf_config = "config.json"', 'hf_config = "config.json"\noverrides = { n_layers = 2 }')
    edit(recipe, "batch_size = 4", "batch_size = 2")
    edit(recipe, "seq_len = 128", "seq_len = 64")
    # one intra-op thread: on a CPU shared with other jobs, spinning OpenMP threads cost 4x
    edit(recipe, 'type = "cpu"', 'type = "cpu"\nthreads = 1')

    # a recipe typo is bad input: exit 2, the attempt is withdrawn
    edit(recipe, "[data]", "[data]\nsorce = 'synthetic'")
    bad = onboard("next-step", "dbg", "--dir", tmp_path)
    assert bad.exit_code == 2 and "sorce" in bad.stderr and "did you mean 'source'" in bad.stderr
    assert json.loads((ws / "ladder.json").read_text())["attempts"] == [] and not (ws / "runs/eager").exists()
    edit(recipe, "[data]\nsorce = 'synthetic'", "[data]")

    # a learning rate of 0 cannot lower the loss: the real gate fails, names the criterion, gives the hint
    edit(recipe, "[data]", "[optimizer]\nlr = 0.0\n\n[data]")
    failed = onboard("next-step", "dbg", "--dir", tmp_path, "--json")
    assert failed.exit_code == 1, failed.stderr
    out = json.loads(failed.stdout)
    assert (out["rung"], out["status"], out["failed"]) == ("eager", "failed", ["loss_falls"])
    assert "did not fall" in out["hints"]["loss_falls"]
    edit(recipe, "[optimizer]\nlr = 0.0\n\n[data]", "[data]")

    passed = onboard("next-step", "dbg", "--dir", tmp_path, "--json")
    assert passed.exit_code == 0, passed.stderr
    out = json.loads(passed.stdout)
    assert (out["rung"], out["attempt"], out["status"], out["next_rung"]) == ("eager", 2, "passed", "parity")
    m = out["measurements"]
    rows = [json.loads(line) for line in (ws / "runs/eager/attempt-2/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == m["steps_run"] == 20 and m["all_finite"] is True
    assert m["step1_loss"] == rows[0]["loss"] and m["step1_grad_norm"] == rows[0]["grad_norm"]  # exact
    assert m["last_loss"] == rows[-1]["loss"] < m["step1_loss"]
    assert m["ln_vocab"] == math.log(2048)
    assert abs(m["step1_loss"] - m["ln_vocab"]) / m["ln_vocab"] == m["step1_loss_rel_to_expected"] <= 0.25
    # the speed and memory numbers are the rows' over the steady window (the first 2 steps left out)
    steady = rows[2:]
    assert m["step_time_median_s"] == statistics.median(r["step_time_s"] for r in steady)
    assert m["tokens_per_s"] == statistics.median(r["tokens_per_s"] for r in steady)
    assert m["mfu"] == statistics.median(r["mfu"] for r in steady)
    assert m["peak_mem_bytes"] == max(r["peak_mem_bytes"] for r in rows)
    assert all(math.isclose(r["tokens_per_s"] * r["step_time_s"], 2 * 64, rel_tol=1e-9) for r in rows)  # batch x seq
    assert m["num_params"] == num_params("llama3", "debugmodel", n_layers=2)
    entry = json.loads((ws / "ladder.json").read_text())["attempts"][-1]
    assert set(entry["files_read"]) == {"recipe.toml", "config.json", "adapter.py"}
    assert entry["environment"]["device"] == "cpu" and entry["environment"]["torch"].startswith("2.")
    assert entry["command"] == f"onboard next-step dbg --dir {tmp_path.resolve()}"

    status = json.loads(onboard("status", "dbg", "--dir", tmp_path, "--json").stdout)
    assert [(r["rung"], r["status"]) for r in status["rungs"][:2]] == [("eager", "passed"), ("parity", "pending")]
    assert status["current_rung"] == "parity"

    waive = onboard("waive", "dbg", "eager", "step1_loss_near_expected", "--why", "demo of a waiver", "--dir", tmp_path)
    assert waive.exit_code == 0
    edit(recipe, "seed = 0", "seed = 1")
    status = json.loads(onboard("status", "dbg", "--dir", tmp_path, "--json").stdout)
    eager = status["rungs"][0]
    assert eager["status"] == "stale" and "recipe.toml" in eager["reason"] and status["current_rung"] == "eager"
    table = onboard("status", "dbg", "--dir", tmp_path).stdout
    assert "stale" in table and "WAIVED CRITERIA" in table

    again = onboard("next-step", "dbg", "--dir", tmp_path, "--json")
    assert again.exit_code == 0, again.stderr
    out = json.loads(again.stdout)
    assert (out["rung"], out["attempt"], out["status"]) == ("eager", 3, "passed")
    assert out["measurements"]["step1_loss"] != m["step1_loss"]  # seed 1: it really ran again
    assert out["waived"] == ["step1_loss_near_expected"]
    entry = json.loads((ws / "ladder.json").read_text())["attempts"][-1]
    assert "recipe.toml" in entry["rerun_reason"]

    assert onboard("report", "dbg", "--dir", tmp_path).exit_code == 0
    report = (ws / "REPORT.md").read_text()
    assert report.index("🔴 WAIVED CRITERIA") < report.index("## eager: passed")  # waivers come first
    assert "| **eager** | **step1_loss_near_expected** | demo of a waiver |" in report
    assert re.search(r"\| loss_falls \| [\d.]+ \| < [\d.]+ \(measurements.step1_loss\) \| ✅ ok \|", report)
    assert "🔴 **WAIVED**: demo of a waiver" in report
    assert "Loss by step: " in report and "## parity: pending" in report and "## tuning: pending" in report
    assert "Earlier attempts:" in report and "| 1 | failed |" in report
