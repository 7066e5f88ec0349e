"""Real-size models on this CPU, end to end: `new-model` of the published Qwen3-8B and
Qwen3-235B-A22B config.json picks a twin (with its table), eager and parity pass on the twin,
and the eager rung's full-size probe counts exactly the parameters transformers' own class
builds on meta from the full config. The ledger and the report say, on every rung, that the
twin ran.

Qwen3-235B-A22B takes the automatic rule (940 GB of fp32 parameters fit no CI host); the
Qwen3-8B workspace asks for its twin (`--twin`), since whether an 8B model fits depends on
the host. Each rung takes seconds on a 2-core machine (one thread); the test asserts minutes at most.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.engine.next_step import next_step
from onboard.report.write import write_report_files
from onboard.workspace.layout import Workspace

transformers = pytest.importorskip("transformers", reason="parity needs the [hf] extra")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the one copy of the published configs
from real_size_configs import PUBLISHED  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.hf]
RUNG_S = 180  # "within a few minutes each" (seconds here)


def upstream_params(cfg: dict) -> int:
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, twin_flag", [("Qwen3-8B", ["--twin"]), ("Qwen3-235B-A22B", [])])
def test_twin_climbs_eager_and_parity_and_the_full_model_is_counted(tmp_path, monkeypatch, name, twin_flag):
    cfg = PUBLISHED[name][2]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    made = CliRunner().invoke(app, ["new-model", "big", "--hf-config", str(tmp_path / "config.json"), "--dir",
                                    str(tmp_path), "--device", "cpu", *twin_flag])  # fmt: skip
    assert made.exit_code == 0, made.stderr
    assert "the gates run on a twin" in made.stdout and "num_hidden_layers" in made.stdout  # the table
    ws = Workspace.load(tmp_path, "big")
    assert ws.twin_path == ws.root / "twin.json"
    # one intra-op thread, as the ladder fixtures run (conftest.narrow_ws): on a 2-core machine other
    # processes share, two threads wait on each other at every small op (10x the step time, measured)
    recipe = ws.recipe_path.read_text()
    assert '[device]\ntype = "cpu"\n' in recipe
    recipe = recipe.replace('[device]\ntype = "cpu"\n', '[device]\ntype = "cpu"\nthreads = 1\n')
    # the eager rung's points (every step finite, the loss falling on its repeated batch, step 1 near ln(vocab),
    # the full model counted) hold at the ladder fixtures' sequence (conftest.narrow_ws) and a few steps
    assert "steps = 20\n" in recipe and "seq_len = 128\n" in recipe
    recipe = recipe.replace("steps = 20\n", "steps = 4\n").replace("seq_len = 128\n", "seq_len = 32\n")
    ws.recipe_path.write_text(recipe)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the parity rung's pytest child

    for rung in ("eager", "parity"):
        outcome = next_step(ws, base_command="test")
        assert (outcome.rung, outcome.status) == (rung, "passed"), json.dumps(outcome.to_json(), indent=1)[-3000:]
        assert outcome.entry["duration_s"] < RUNG_S
        assert outcome.entry["model"].startswith("twin of the full model: twin.json (num_hidden_layers 2")
        ws = Workspace.load(tmp_path, "big")

    eager = ws.ledger.entries("eager")[-1]["measurements"]
    assert eager["vocab_size"] == 2048  # the twin trained ...
    assert eager["full_model_params_total"] == upstream_params(cfg)  # ... the full model was counted on meta
    assert eager["full_model_key_mismatches"] == 0
    if cfg.get("num_experts"):
        assert eager["full_model_params_active"] == 22_190_763_520
    parity = ws.ledger.entries("parity")[-1]
    assert parity["details"]["model"] == "twin (twin.json)" and parity["details"]["upstream_class"].startswith("Qwen3")
    summary = write_report_files(ws).markdown.read_text()
    assert "**Every rung ran on a twin**" in summary and f"{eager['full_model_params_total']:,} parameters" in summary
