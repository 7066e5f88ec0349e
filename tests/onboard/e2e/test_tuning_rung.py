"""The tuning rung on narrowed llama3 debug workspaces (dim 64, 2 layers, 4 x 32 tokens, one thread):
it passes with real measurements and every change classified and timed, rejects and names an injected
diverging flag, keeps the batch when the memory budget binds (saying why), sweeps fused_ce's chunk,
and through the engine writes what it kept into recipe.toml, leaves the earlier rungs' evidence
standing (its own gate proves its edit), and re-verifies after a hand edit of the same key.

Every decision here is timed with the `quick` timing profile: these tests prove the
rung's mechanics (each change classified and timed, the keep rule, the batch search, the edits);
the demo (test_demo.py) runs the rung with the shipped protocol.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from timing_checks import check_comparison

from onboard.ladder.gates import evaluate, gate_passed, load_checklist
from onboard.ladder.table import RUNGS, RungSpec
from onboard.ladder.states import ladder_states
from onboard.engine.next_step import next_step
from onboard.rungs import eager_rung as eager
from onboard.rungs import gate_recipe
from onboard.rungs.tuning_rung import classify as tuning_classify
from onboard.ladder.contract import RungContext, settle_runs
from onboard.rungs.tuning_rung.runs import Runs
from onboard.workspace.layout import Workspace
from onboard.rungs.tuning_rung import flags as flag_table
from onboard.rungs.tuning_rung.classify import CLASSES
from onboard.rungs.tuning_rung.profile import CATEGORIES

# whole_machine: the rung times its changes, and the climbs beside it would be its noise
pytestmark = [pytest.mark.slow, pytest.mark.whole_machine]
MODULE = "onboard.rungs.tuning_rung.rung"
tuning = importlib.import_module(MODULE)

DIVERGING = flag_table.Flag(
    "inject.seed", "cpu", "another init seed: injected, a change that must be rejected", config=(("training.seed", 1),)
)


def run(module, ws, tmp_path: Path, evidence: dict, lines: list):
    attempt = tmp_path / "runs" / module.RUNG / f"attempt-{len(list(tmp_path.glob(f'runs/{module.RUNG}/*'))) + 1}"
    attempt.mkdir(parents=True)
    ctx = RungContext(workspace=ws, attempt_dir=attempt, evidence=evidence, log=lines.append, timing_profile="quick")
    result = module.run(ctx)
    settle_runs(result.measurements, ctx.runs)  # as the engine does
    return result


def with_eager(ws, tmp_path) -> dict:
    return {"eager": run(eager, ws, tmp_path, {}, []).measurements}


def test_the_rung_passes_classifies_every_change_and_rejects_a_diverging_flag(narrow_ws, tmp_path, monkeypatch):
    table = flag_table.flags_for
    monkeypatch.setattr(flag_table, "flags_for", lambda kind, cores=1: table(kind, cores=cores) + (DIVERGING,))
    ws = narrow_ws("llama3")
    evidence = with_eager(ws, tmp_path)
    lines: list[str] = []
    result = run(tuning, ws, tmp_path, evidence, lines)
    m, d = result.measurements, result.details
    criteria = evaluate(load_checklist("tuning"), m, evidence)
    assert gate_passed(criteria), [c for c in criteria if not c["ok"]]

    changes = {c["change"]: c for c in d["changes"]}
    assert {"threads=2", "inject.seed"} <= set(changes) and m["changes_tried"] == len(d["changes"])
    for c in d["changes"]:
        assert c["class"] in CLASSES and c["classification"]["rounding_rel"] == gate_recipe.bound("tuning", "final_step1_loss", "fp32", {})
        assert (c["timing"] is None) == (c["class"] == "diverged"), c  # a diverged change is never timed
        if c["timing"]:  # timed per token: tokens/s is the inverse of the median, the outcome its interval's
            assert c["timing"]["rounds"] >= 2 and c["describe"].startswith(c["change"])
            assert c["tokens_per_s"] == 1 / c["timing"]["candidate_median_s"]
            check_comparison(c["timing"], tuning.protocol().min_effect)
    bad = changes["inject.seed"]
    assert (bad["class"], bad["kept"]) == ("diverged", False) and bad["why"].startswith("rejected: step-1 ")
    named = [line for line in lines if line.startswith("tuning: flags: inject.seed: diverged")]
    assert len(named) == 1 and "not kept (rejected: step-1 " in named[0]
    assert "inject.seed" not in json.dumps([e.to_dict() for e in result.recipe_edits])

    # the flag table: tried where it can act here, every other flag with why not; TPU rendered, not run
    flags = {r["flag"]: r for r in d["flags"]}
    assert flags["threads=2"]["tried"] and flags["threads=1"]["why"] == "the recipe already has it"
    assert not flags["inductor.freezing"]["tried"] and "inference" in flags["inductor.freezing"]["why"]
    assert d["tpu_flags"]["libtpu_init_args"] == flag_table.libtpu_init_args(flag_table.TPU_FLAGS)
    assert any("TPU flags rendered, not run (no TPU here)" in line for line in lines)
    assert any(n["what"] == "attention (sdpa)" and "no block-size setting" in n["why"] for n in d["not_tried"])

    # the batch: every batch tried has its peak and tokens/s, the stop says why
    batch = d["batch"]
    assert batch["stopped"] in ("memory", "throughput", "grid") and batch["why"] == m["batch_why"]
    assert all(t["peak_bytes"] > 0 and t["tokens_per_s"] > 0 for t in batch["tried"] if t["outcome"] != "over_memory")
    assert batch["budget_source"] == "MemAvailable in /proc/meminfo" or "cgroup" in batch["budget_source"]
    # activation checkpointing buys a batch only where memory ended the search
    ckpt = d["activation_checkpoint"]
    assert m["checkpoint_tried"] == ckpt["tried"] == (batch["stopped"] == "memory")
    assert m["checkpoint_kept_not_exact"] == 0
    if not ckpt["tried"]:
        assert "memory did not end the batch search" in ckpt["why"] and ckpt["modes"] == {}

    # the final recipe: classified against the untuned one on the same rows, run whole, profiled
    final = d["final"]
    assert m["final_run_whole"] and m["final_steps_run"] == tuning.param("final_steps") == len(final["loss_curve"])
    assert final["step1"]["loss"] == m["step1_loss"]  # the whole run's step 1 is the probed one
    assert m["final_class"] in ("bit_identical", "rounding") and m["final_step1_loss_rel_err"] <= 1e-5
    assert m["profiled"] and m["profile_biggest"] in CATEGORIES and m["profile_within_tolerance"]
    assert (ws.root.parent.parent / m["profile_trace"]).is_file() or Path(m["profile_trace"]).is_file()
    for e in result.recipe_edits:
        assert e.key in tuning.TUNED_KEYS and e.why.startswith("tuning rung (")
    assert {p.name for p in result.files_read} == {"recipe.toml", "config.json", "adapter.py"}


def test_a_binding_budget_keeps_the_batch_and_the_chunk_sweep_runs(narrow_ws, tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "memory_budget", lambda device: (1, "a 1-byte test budget"))
    monkeypatch.setattr(flag_table, "flags_for", lambda kind, cores=1: ())
    ws = narrow_ws("llama3")
    text = ws.recipe_path.read_text().replace("[training]\n", "[training]\ngrad_accum = 2\n")
    ws.recipe_path.write_text(text + '\n[kernels]\nloss = "fused_ce"\nce_chunk = 64\n')
    lines: list[str] = []
    result = run(tuning, Workspace.load(ws.root.parent.parent, ws.name), tmp_path, {}, lines)
    m, d = result.measurements, result.details
    assert gate_passed(evaluate(load_checklist("tuning"), m, {}))
    # the budget binds at the recipe's own batch: not raised, and the reason says so
    assert m["fixed_global_batch"] and m["batch_stopped"] == "memory" and "not raised" in m["batch_why"]
    assert (m["batch_size"], m["grad_accum"]) == (4, 2) and [t["outcome"] for t in d["batch"]["tried"]] == ["start"]
    assert m["memory_budget_source"] == "a 1-byte test budget"
    assert not any(e.key.startswith("training.") for e in result.recipe_edits)
    # memory ended the search: each checkpointing mode proved at the recipe's own batch (fp32: bit for bit),
    # then run at the batch it would buy (8 x 1, the global batch fixed), over the budget there: not kept
    ckpt = d["activation_checkpoint"]
    assert m["checkpoint_tried"] and ckpt["tried"] and list(ckpt["modes"]) == ["selective", "full"]
    for mode, row in ckpt["modes"].items():
        assert row["same_batch_class"] == "bit_identical" and row["label"] == f"ac={mode},batch=8"
        assert not row["kept"] and "over the limit" in row["why"] and row["peak_bytes"] > row["limit_bytes"]
    assert m["checkpoint_kept_not_exact"] == 0 and "activation_checkpoint.mode" not in m["proposed_recipe_edits"]
    assert any("ac=full at the holder's batch: bit_identical" in line for line in lines)
    # fused_ce's chunk over the CPU grid (from 64): 256 is one chunk of the 128 tokens per micro-batch;
    # 4096 is that same single chunk, so it runs only when 256 did not take the field
    chunks = [c for c in d["changes"] if c["step"] == "block_sizes"]
    assert chunks[0]["change"] == "ce_chunk=256" and all(c["class"] in ("bit_identical", "rounding") for c in chunks)
    if chunks[0]["kept"]:
        assert len(chunks) == 1 and m["proposed_recipe_edits"] == ["kernels.ce_chunk=256"]
        assert any(n["what"] == "ce_chunk=4096" and "same single chunk" in n["why"] for n in d["not_tried"])
    else:
        assert [c["change"] for c in chunks] == ["ce_chunk=256", "ce_chunk=4096"]


def test_the_engine_writes_the_kept_batch_is_proved_by_its_own_gate_and_a_hand_edit_re_verifies(
    narrow_ws, tmp_path, monkeypatch
):
    from titan_core.measure.timing import compare

    def scripted(self, candidate, holder, protocol):  # batch 8 is faster than 4; nothing else is faster
        ratio = 0.5 if candidate == "batch=8" else 2.0
        return compare(lambda: ratio, lambda: 1.0, protocol)

    monkeypatch.setattr(Runs, "compare", scripted)
    ws = narrow_ws("llama3")
    specs = [RungSpec(r, {"eager": "onboard.rungs.eager_rung", "tuning": MODULE}.get(r)) for r in RUNGS]
    base = ws.root.parent.parent

    def step():
        return next_step(Workspace.load(base, ws.name), specs=specs, timing_profile="quick")

    assert step().status == "passed"
    first = step()
    assert (first.rung, first.status) == ("tuning", "passed"), first.criteria
    assert [e["key"] for e in first.entry["recipe_edit"]["edits"]] == ["training.batch_size"]
    assert first.entry["details"]["timing_profile"] == "quick"  # not to be read as the shipped protocol's
    assert first.entry["measurements"]["flags"] == ["--training.batch_size=8"]  # what its final run had on top
    # one Decision per change tried: the batch's chain, each against the batch it challenged
    found = first.entry["details"]["decisions"]
    batch = [(d["holder"], d["candidate"], d["verdict"]) for d in found if d["lever"] == "training.batch_size"]
    assert batch[0] == ("4", "8", "kept") and [d["verdict"] for d in found].count("kept") == 1, found
    assert "batch_size = 8  # tuning rung (batch): batch=8 is 2.00x faster than untuned" in ws.recipe_path.read_text()
    states = {s.rung: s.status for s in ladder_states(Workspace.load(base, ws.name), specs)}
    # tuning's own gate proved its edit (table.TUNING_KEYS): eager's evidence stands
    assert (states["eager"], states["tuning"]) == ("passed", "passed")
    assert step().status == "complete"
    # a hand edit of the same key is not proved by anyone: eager re-verifies, then tuning again
    ws.recipe_path.write_text(ws.recipe_path.read_text().replace("batch_size = 8", "batch_size = 4", 1))
    states = {s.rung: s.status for s in ladder_states(Workspace.load(base, ws.name), specs)}
    assert states["eager"] == "stale"
    assert step().rung == "eager"
    second = step()
    assert (second.rung, second.status) == ("tuning", "passed")
    assert second.entry["measurements"]["batch_size"] == 8


def test_a_faster_rounding_batch_whose_curve_drifts_is_not_kept(narrow_ws, tmp_path, monkeypatch):
    from titan_core.measure.timing import compare

    def scripted(self, candidate, holder, protocol):  # batches 8 and 16 faster per token, nothing else
        ratio = 0.5 if candidate in ("batch=8", "batch=16") else 2.0
        return compare(lambda: ratio, lambda: 1.0, protocol)

    checklist = tuning.param
    monkeypatch.setattr(Runs, "compare", scripted)
    monkeypatch.setattr(tuning, "param", lambda name, precision=None: 0.0 if name == "curve_rel" else checklist(name, precision))
    monkeypatch.setattr(flag_table, "flags_for", lambda kind, cores=1: ())
    ws = narrow_ws("llama3")
    # this model's batch of 16 and 4 x 4 accumulated now give equal step-1 numbers (bit_identical): a
    # part in 1e7 on the candidate's loss makes the change the rounding class this test is about
    real = tuning_classify.classify
    monkeypatch.setattr(tuning, "classify", lambda cand, base, **kw: real(  # the rung's own name for it
        tuning_classify.Step1(cand.loss * (1 + 1e-7), cand.grad_norm), base, **kw))
    result = run(tuning, ws, tmp_path, {}, [])
    m, (change,) = result.measurements, [c for c in result.details["changes"] if c["step"] == "batch"]
    # 16 rows in one micro-batch against the recipe's 4 accumulated four times: rounding, faster, but its
    # loss curve is not within a tolerance of 0 of the recipe's, so the recipe's batch stays
    assert (change["change"], change["class"], change["kept"]) == ("batch=16", "rounding", False)
    assert change["classified_against"] == "untuned@16rows" and change["curve"]["ok"] is False
    # the chain's Decisions: 8 against 4, 16 against 8, both faster, neither eligible once 16's curve left
    batch = {d["candidate"]: d for d in result.details["decisions"] if d["lever"] == "training.batch_size"}
    assert (batch["8"]["holder"], batch["16"]["holder"]) == ("4", "8")
    assert {batch[k]["verdict"] for k in ("8", "16")} == {"not eligible"} and "was not kept" in batch["8"]["why"]
    assert change["why"].startswith("faster but a rounding change, and its loss curve over 10 steps")
    assert m["batch_size"] == 4 and result.recipe_edits == [] and m["final_recipe"] == "untuned"
    assert gate_passed(evaluate(load_checklist("tuning"), m, {})) and m["profiled"]
