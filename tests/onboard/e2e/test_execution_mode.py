"""The execution-mode choice of the graph_trainer rung: the recipe's mode (the holder) stands unless
another mode is faster than it by the timing protocol, and the choice comes back as recipe edits of
exactly the keys that change, with the lever's one Decision. (Scripted comparisons, the holder
rule in detail: tests/onboard/e2e/test_lever_decisions.py.)"""

from __future__ import annotations

import pytest

from onboard.rungs import execution_mode
from onboard.rungs import gate_recipe
from onboard.ladder.contract import RungContext


class Scripted:
    """A trainer whose steps take a scripted, noiseless time."""

    def __init__(self, seconds: float):
        self.seconds, self.closed = seconds, False

    def train_step(self):
        return {"step_time_s": self.seconds}

    def close(self):
        self.closed = True


def choose(debug_ws, tmp_path, monkeypatch, times: dict[str, float], moe=None):
    made = {}

    def trainer(base, out, mode, moe_):
        made[mode] = Scripted(times[mode])
        return made[mode]

    monkeypatch.setattr(execution_mode, "_trainer", trainer)
    ctx = RungContext(workspace=debug_ws, attempt_dir=tmp_path, evidence={}, log=lambda line: None)
    edits, record = execution_mode.choose(
        ctx, gate_recipe.job_config(ctx), rung="graph_trainer", moe=moe, modes=list(times)
    )
    assert all(t.closed for t in made.values())
    return {e.key: e.value for e in edits}, record


def test_a_faster_mode_is_chosen_and_written(debug_ws, tmp_path, monkeypatch):
    edits, record = choose(debug_ws, tmp_path, monkeypatch, {"eager": 0.2, "compile": 0.1, "graph_trainer": 0.3})
    assert record["execution_mode"] == "compile" and edits == {"compile.enable": True}
    assert "execution_mode=compile is faster than execution_mode=eager: 2.00x" in record["execution_mode_why"]
    (d,) = record["decisions"]
    assert (d["lever"], d["holder"], d["candidate"], d["value"], d["verdict"]) == (
        "execution_mode", "eager", "compile", "compile", "kept")
    assert "graph_trainer is 1.50x slower than eager" in d["why"]  # the other mode's comparison beside it


def test_a_tie_keeps_eager_and_edits_nothing(debug_ws, tmp_path, monkeypatch):
    edits, record = choose(debug_ws, tmp_path, monkeypatch, {"eager": 0.2, "compile": 0.2, "graph_trainer": 0.201})
    assert record["execution_mode"] == "eager" and edits == {}
    assert {c["outcome"] for c in record["execution_mode_vs_holder"].values()} == {"indistinguishable"}
    assert record["decisions"][0]["verdict"] == "indistinguishable" and record["decisions"][0]["value"] == "eager"


@pytest.mark.parametrize("graph, chosen", [(0.05, "graph_trainer"), (0.1, "compile")])
def test_two_faster_modes_meet_head_to_head(debug_ws, tmp_path, monkeypatch, graph, chosen):
    edits, record = choose(debug_ws, tmp_path, monkeypatch, {"eager": 0.2, "compile": 0.1, "graph_trainer": graph})
    h2h = record["execution_mode_head_to_head"]  # graph_trainer timed against compile, noiseless
    assert record["execution_mode"] == chosen and h2h["ratio"] == pytest.approx(graph / 0.1, rel=1e-12)
    assert h2h["outcome"] == ("faster" if chosen == "graph_trainer" else "indistinguishable")
    assert edits == ({"graph_trainer.enable": True} if chosen == "graph_trainer" else {"compile.enable": True})


def test_a_captured_mode_brings_the_experts_it_ran(debug_ws, tmp_path, monkeypatch):
    edits, _ = choose(debug_ws, tmp_path, monkeypatch, {"eager": 0.2, "graph_trainer": 0.1}, moe="dense")
    assert edits == {"graph_trainer.enable": True, "kernels.moe": "dense"}


def test_rungs_that_run_their_own_mode_do_not_read_the_mode_keys():
    from onboard.ladder.table import TABLE  # each rung's declaration

    eager, simple_fsdp, compile_rung, graph_trainer, kernels, parity = (
        TABLE[r] for r in ("eager", "simple_fsdp", "compile", "graph_trainer", "kernels", "parity")
    )

    for rung in (eager, simple_fsdp, compile_rung, graph_trainer):
        assert not rung.reads_recipe_key("compile.enable") and not rung.reads_recipe_key("graph_trainer.enable")
        assert rung.reads_recipe_key("kernels.loss") and rung.reads_recipe_key("training.seq_len")
        # the tuning rung's own gate proves its edits of these (table.TUNING_KEYS)
        assert not rung.reads_recipe_key("training.batch_size") and not rung.reads_recipe_key("kernels.ce_chunk")
    assert parity.reads_recipe_key("model.hf_config") and not parity.reads_recipe_key("kernels.loss")
    # kernels judges kernels in the recipe's mode: it reads every key but the tuning rung's
    assert kernels.reads_recipe_key("compile.enable") and not kernels.reads_recipe_key("training.batch_size")


def _recipe_says(debug_ws, line: str) -> None:
    with open(debug_ws.recipe_path, "a") as f:
        f.write(f"\n{line}\n")


@pytest.mark.parametrize("times, kept", [
    ({"eager": 0.2, "compile": 0.2, "graph_trainer": 0.2}, "compile"),      # a tie: the recipe's proven mode stands
    ({"eager": 0.2, "compile": 0.1, "graph_trainer": 0.1}, "compile"),      # graph_trainer only ties it head to head
    ({"eager": 0.2, "compile": 0.1, "graph_trainer": 0.05}, "graph_trainer"),  # beaten head to head: it goes
    ({"eager": 0.2, "compile": 0.4, "graph_trainer": 0.4}, "eager"),        # slower than eager now: it goes
])  # fmt: skip
def test_a_re_run_keeps_the_recipes_mode_unless_beaten(debug_ws, tmp_path, monkeypatch, times, kept):
    """Re-verification must not flip a choice on noise (the ladder would go round and round):
    the recipe's mode stands unless this attempt found another one faster than it."""
    _recipe_says(debug_ws, "[compile]\nenable = true")
    edits, record = choose(debug_ws, tmp_path, monkeypatch, times)
    assert record["execution_mode_was"] == "compile" and record["execution_mode"] == kept
    if kept == "compile":
        assert edits == {}
    else:
        assert edits == {"compile.enable": False, **({"graph_trainer.enable": True} if kept == "graph_trainer" else {})}
    (d,) = record["decisions"]
    assert d["holder"] == "compile" and d["value"] == kept
    if kept == "compile":  # nothing beat the holder: it stands, and the record says so
        assert d["verdict"] in ("indistinguishable", "held") and "; compile stands" in d["why"]
