"""The holder rule of the rungs that decide a lever (issue 33), on scripted comparisons (no timing):
the recipe's value stands unless the candidate timed against it is `faster`, a reversal of an
earlier rung's value names that rung, and each lever comes back as one Decision record.

- execution mode (graph_trainer's `execution_mode.choose`): every other mode against the recipe's;
- simple_fsdp's training.mixed_precision_param (`recipe_choices`): the other precision against the
  recipe's, or a Decision with no figure when bf16 is decided untimed.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from onboard.ladder import decision
from onboard.rungs import execution_mode
from onboard.rungs import gate_recipe
from onboard.rungs import simple_fsdp_rung as simple_fsdp
from onboard.ladder.contract import RungContext
from onboard.workspace.layout import Workspace
from onboard.workspace.scaffold import plan_workspace, write_workspace
from onboard.ladder.gates import timed_apart
from titan_core.measure.timing import Comparison


def scripted(c: float, b: float, *, outcome: str | None = None, ci_high: float | None = None) -> Comparison:
    """A comparison of candidate time `c` against baseline time `b`: ratio c / b, a +-3% interval, and
    the outcome that interval gives (or the one given)."""
    ratio = c / b
    lo, hi = ratio / 1.03, ci_high if ci_high is not None else ratio * 1.03
    said = outcome or ("faster" if hi < 1 else "slower" if lo > 1 else "indistinguishable")
    return Comparison(said, ratio, lo, hi, 0.99, 8, "interval", c, b)


class Step:
    """A trainer whose steps take a scripted time."""

    def __init__(self, seconds: float):
        self.seconds, self.closed = seconds, False

    def train_step(self):
        return {"step_time_s": self.seconds}

    def close(self):
        self.closed = True


@pytest.fixture
def ws(tmp_path) -> Workspace:
    write_workspace(plan_workspace("dbg", tmp_path, preset="llama3/debugmodel", device="cpu"))
    return Workspace.load(tmp_path, "dbg")


def recipe_says(ws: Workspace, text: str) -> None:
    with open(ws.recipe_path, "a") as f:
        f.write(f"\n{text}\n")


def set_by(rung: str, key: str, value) -> SimpleNamespace:
    """A ledger whose one passed attempt, of `rung`, wrote `key` = `value` into the recipe."""
    edit = {"edits": [{"key": key, "value": value, "why": ""}]}
    entry = SimpleNamespace(rung=rung, status="passed", recipe_edit=edit)
    return SimpleNamespace(attempts=[entry])


def ctx_of(ws: Workspace, tmp_path) -> RungContext:
    return RungContext(workspace=ws, attempt_dir=tmp_path / "attempt", evidence={}, log=lambda line: None)


# ---- the execution mode ------------------------------------------------------------------------
def choose(ws, tmp_path, monkeypatch, times: dict[str, float], compare=None):
    made = {}

    def trainer(base, out, mode, moe):
        made[mode] = Step(times[mode])
        return made[mode]

    monkeypatch.setattr(execution_mode, "_trainer", trainer)
    monkeypatch.setattr(execution_mode, "compare", compare or (lambda c, b, proto: scripted(c(), b())))
    ctx = ctx_of(ws, tmp_path)
    edits, record = execution_mode.choose(ctx, gate_recipe.job_config(ctx), rung="graph_trainer", moe=None,
                                          modes=list(times))  # fmt: skip
    assert all(t.closed for t in made.values())
    (d,) = record["decisions"]  # one record of the one lever
    assert d["lever"] == "execution_mode" and d["value"] == record["execution_mode"]
    return {e.key: e.value for e in edits}, record, d


def test_the_recipes_compile_stands_when_eager_is_indistinguishable(ws, tmp_path, monkeypatch):
    recipe_says(ws, "[compile]\nenable = true")
    edits, record, d = choose(ws, tmp_path, monkeypatch, {"eager": 0.2, "compile": 0.2, "graph_trainer": 0.4})
    assert record["execution_mode_holder"] == "compile" and set(record["execution_mode_vs_holder"]) == {
        "eager", "graph_trainer"}  # fmt: skip
    assert edits == {} and (d["holder"], d["value"]) == ("compile", "compile")
    # the closest challenger is the record: eager, indistinguishable; graph_trainer's slower timing beside it
    assert (d["candidate"], d["verdict"], d["reverses"]) == ("eager", "indistinguishable", None)
    assert d["speedup"] == pytest.approx(1.0) and d["ci"][0] < 1 < d["ci"][1]
    assert "compile stands" in d["why"] and "graph_trainer is 2.00x slower than compile" in d["why"]


@pytest.mark.parametrize("earlier, reverses", [("compile", "compile"), ("graph_trainer", None)])
def test_a_faster_graph_trainer_replaces_compile_naming_the_rung_it_reverses(ws, tmp_path, monkeypatch, earlier,
                                                                            reverses):  # fmt: skip
    recipe_says(ws, "[compile]\nenable = true")
    ws.ledger = set_by(earlier, "compile.enable", True)
    edits, record, d = choose(ws, tmp_path, monkeypatch, {"eager": 0.3, "compile": 0.2, "graph_trainer": 0.1})
    assert edits == {"compile.enable": False, "graph_trainer.enable": True}
    assert (d["holder"], d["candidate"], d["verdict"], d["figure"]) == ("compile", "graph_trainer", "kept", "speed")
    assert d["speedup"] == pytest.approx(2.0) and d["ci"][0] > 1  # holder time / candidate time, its interval
    assert d["reverses"] == reverses  # a re-run of the rung that set it reverses nobody
    assert ("reverses the compile rung's execution_mode=compile" in d["why"]) == (reverses is not None)
    assert record["execution_mode_why"] == f"graph_trainer rung: {d['why']}"


@pytest.mark.parametrize("graph, chosen", [(0.05, "graph_trainer"), (0.1, "compile")])
def test_two_modes_faster_than_the_holder_meet_head_to_head(ws, tmp_path, monkeypatch, graph, chosen):
    edits, record, d = choose(ws, tmp_path, monkeypatch, {"eager": 0.2, "compile": 0.1, "graph_trainer": graph})
    h2h = record["execution_mode_head_to_head"]  # graph_trainer timed against compile
    assert h2h["ratio"] == pytest.approx(graph / 0.1) and (d["candidate"], d["verdict"]) == (chosen, "kept")
    assert edits == ({"graph_trainer.enable": True} if chosen == "graph_trainer" else {"compile.enable": True})
    assert "head to head" in d["why"]


def test_a_faster_outcome_without_a_finite_interval_leaves_the_holder(ws, tmp_path, monkeypatch):
    def unbounded(c, b, proto):  # says faster, but its interval is not finite: not measured
        return scripted(c(), b(), outcome="faster", ci_high=math.inf)

    edits, record, d = choose(ws, tmp_path, monkeypatch, {"eager": 0.2, "graph_trainer": 0.1}, compare=unbounded)
    assert edits == {} and (d["value"], d["verdict"], d["speedup"], d["ci"]) == ("eager", "not measured", None, None)
    assert decision.headline([d]) == "execution_mode graph_trainer: not measured"


# ---- simple_fsdp's bf16 parameters ---------------------------------------------------------------
M = {"bf16_loss_curve_max_rel": 0.001,
     "fsdp2_vs_simple_fsdp_context": timed_apart(0.14, 0.2, "SimpleFSDP", "FSDP2")}


def test_bf16_indistinguishable_from_the_holder_leaves_it_standing(ws, tmp_path):
    ctx = ctx_of(ws, tmp_path)
    edits, choice, (d,) = simple_fsdp.recipe_choices(ctx, None, M, timing=scripted(0.2, 0.2))
    assert edits == [] and choice["mixed_precision_choice"] == "float32"
    assert (d["lever"], d["holder"], d["candidate"], d["value"]) == ("training.mixed_precision_param", "float32",
                                                                     "bfloat16", "float32")  # fmt: skip
    assert (d["verdict"], d["figure"]) == ("indistinguishable", "speed") and "float32 stands" in d["why"]
    assert choice["mixed_precision_timing"]["ratio"] == pytest.approx(1.0)


def test_a_bf16_holder_stands_unless_fp32_is_faster_than_it(ws, tmp_path):
    text = ws.recipe_path.read_text().replace("[training]\n", '[training]\nmixed_precision_param = "bfloat16"\n', 1)
    ws.recipe_path.write_text(text)
    ctx = ctx_of(ws, tmp_path)
    edits, _, (d,) = simple_fsdp.recipe_choices(ctx, None, M, timing=scripted(0.2, 0.2))  # fp32 against bf16
    assert edits == [] and (d["holder"], d["candidate"], d["value"]) == ("bfloat16", "float32", "bfloat16")
    edits, _, (d,) = simple_fsdp.recipe_choices(ctx, None, M, timing=scripted(0.1, 0.2))  # fp32 twice as fast
    assert [(e.key, e.value) for e in edits] == [("training.mixed_precision_param", "float32")]
    assert (d["verdict"], d["value"], d["speedup"]) == ("kept", "float32", pytest.approx(2.0))


def test_bf16_decided_untimed_is_a_decision_with_no_figure(ws, tmp_path):
    ctx = ctx_of(ws, tmp_path)
    # a curve beyond the checklist's bound: bf16 is not eligible, nothing timed
    edits, choice, (d,) = simple_fsdp.recipe_choices(ctx, None, {**M, "bf16_loss_curve_max_rel": 0.5})
    assert edits == [] and choice["mixed_precision_timing"] is None
    assert (d["verdict"], d["figure"], d["speedup"], d["value"]) == ("not eligible", "none", None, "float32")
    # bf16 parameters (training.dtype): gathered as they are, untimed, and never a made-up speed
    text = ws.recipe_path.read_text().replace('dtype = "float32"', 'dtype = "bfloat16"', 1)
    ws.recipe_path.write_text(text)
    edits, choice, (d,) = simple_fsdp.recipe_choices(ctx, None, M)
    assert [(e.key, e.value) for e in edits] == [("training.mixed_precision_param", "bfloat16")]
    assert (d["verdict"], d["figure"], d["speedup"], d["ci"]) == ("kept", "none", None, None)
    assert "training.dtype" in d["why"] and "training.dtype" in choice["mixed_precision_why"]


def test_an_interval_too_wide_to_say_anything_decides_nothing_and_prints_as_not_measured():
    """A bf16 timing once recorded "0.00-512246.96": finite, positive, and no use to anyone."""
    wide = {"ratio": 0.5, "ci_low": 1e-6, "ci_high": 0.9, "outcome": "faster", "confidence": 0.99, "rounds": 5}
    d = decision.decide("tuning", "training.batch_size", holder=4, candidate=8, comparison=wide)
    assert d.verdict == decision.NOT_MEASURED and d.value == 4 and d.speedup is None
    assert "was not measured" in d.why and "1000000" not in d.why
    narrow = {**wide, "ci_low": 0.4, "ci_high": 0.6}
    kept = decision.decide("tuning", "training.batch_size", holder=4, candidate=8, comparison=narrow)
    assert kept.verdict == decision.KEPT and "2.00x (1.67-2.50)" in kept.why
    assert decision.headline([{**kept.to_dict(), "ci": [1e-3, 5e5]}]) == "training.batch_size=8: not measured kept"
