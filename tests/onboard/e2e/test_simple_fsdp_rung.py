"""The simple_fsdp rung's pieces that need no process group: the world size it picks, the
baseline it chooses and why, bad input refused before anything starts, the measurements'
arithmetic, and a checklist whose metrics the rung really measures. (End to end, with real
2-process runs: test_simple_fsdp_e2e.py.)"""

from __future__ import annotations

import math
import re

import pytest
from timing_checks import check_comparison

from onboard.errors import BadInput
from onboard.ladder.gates import evaluate, gate_passed, load_checklist, timed_apart
from onboard.rungs import gate_recipe
from onboard.rungs import parallel_degrees
from onboard.rungs import simple_fsdp_rung as simple_fsdp
from titan_core.measure.numerics import curve_max_rel
from onboard.ladder.contract import RungContext

EVIDENCE = {"eager": {"step1_loss": 7.5, "step1_grad_norm": 3.0}}


def ctx_for(ws, tmp_path, evidence=EVIDENCE):
    return RungContext(workspace=ws, attempt_dir=tmp_path / "attempt", evidence=evidence, log=lambda line: None)


def set_recipe(ws, old: str, new: str) -> None:
    text = ws.recipe_path.read_text()
    assert old in text, f"{old!r} not in the recipe template any more"
    ws.recipe_path.write_text(text.replace(old, new))


def rows(losses, norm=3.0, step_time=0.1):
    return [
        {
            "loss": x,
            "grad_norm": norm,
            "step_time_s": step_time,
            "tokens_per_s": 1000.0,
            "mfu": 0.1,
            "peak_mem_bytes": 1 << 20,
        }
        for x in losses
    ]


def test_world_size_is_two_processes_on_cpu():
    assert simple_fsdp.world_size("cpu") == 2


def test_odd_global_batch_is_bad_input_before_any_process_starts(debug_ws, tmp_path, monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("nothing may start on bad input")

    monkeypatch.setattr("titan_core.launcher.run_world", no_launch)
    set_recipe(debug_ws, "batch_size = 4", "batch_size = 3")
    with pytest.raises(BadInput, match=r"batch_size = 3 does not split over 2 ranks"):
        simple_fsdp.run(ctx_for(debug_ws, tmp_path))


def test_dense_synthetic_fp32_compares_with_the_eager_evidence(debug_ws, tmp_path):
    cfg = gate_recipe.job_config(ctx_for(debug_ws, tmp_path))
    assert simple_fsdp.baseline_reason(cfg, EVIDENCE) is None
    assert "no passed eager evidence" in simple_fsdp.baseline_reason(cfg, {})


def test_text_data_compares_with_the_eager_evidence(debug_ws, tmp_path):
    """Ignored labels spread unevenly over the ranks are no reason: the loss is the global token
    mean (titan_core/parallel/token_mean.py; tests/core/dist/test_token_mean.py checks the arithmetic)."""
    set_recipe(debug_ws, '[data]\nsource = "synthetic"', '[data]\nsource = "text"\npath = "corpus.txt"')
    cfg = gate_recipe.job_config(ctx_for(debug_ws, tmp_path))
    assert cfg.data.source == "text"
    assert simple_fsdp.baseline_reason(cfg, EVIDENCE) is None


@pytest.mark.parametrize(
    "edit, why",
    [
        (('dtype = "float32"', 'dtype = "bfloat16"'), r"not fp32 \(training.dtype\)"),
        (
            ('dtype = "float32"', 'dtype = "float32"\nmixed_precision_reduce = "bfloat16"'),
            r"not fp32 \(training.mixed_precision_reduce\)",
        ),
    ],
)
def test_other_arithmetic_needs_its_own_baseline(debug_ws, tmp_path, edit, why):
    set_recipe(debug_ws, *edit)
    cfg = gate_recipe.job_config(ctx_for(debug_ws, tmp_path))
    assert re.search(why, simple_fsdp.baseline_reason(cfg, EVIDENCE))


def test_moe_aux_loss_needs_the_grad_accum_baseline(tmp_path):
    from onboard.workspace.scaffold import plan_workspace, write_workspace
    from onboard.workspace.layout import Workspace

    write_workspace(plan_workspace("moe", tmp_path, preset="qwen3_moe/debugmodel", device="cpu"))
    ws = Workspace.load(tmp_path, "moe")
    cfg = gate_recipe.job_config(ctx_for(ws, tmp_path))
    why = simple_fsdp.baseline_reason(cfg, EVIDENCE)
    assert why is not None and "aux_loss_coef = 0.001" in why and "grad_accum = W" in why
    base = simple_fsdp.baseline_config(cfg, tmp_path / "b", world=2)
    t = base.training
    # one process, W micro-batches of B/W rows: the rows of the W ranks, in rank order
    assert (t.steps, t.batch_size, t.grad_accum, t.dtype) == (1, cfg.training.batch_size // 2, 2, "float32")


def test_sharded_config_gives_each_rank_its_share_and_one_thread_per_core(debug_ws, tmp_path):
    cfg = gate_recipe.job_config(ctx_for(debug_ws, tmp_path))
    cfg.parallelism.tp = 2  # whatever the recipe says, the rung shards over every rank
    s = simple_fsdp.sharded_config(cfg, tmp_path / "x", world=2, mode="fsdp2", param_dtype="bfloat16")
    assert s.training.batch_size * 2 == cfg.training.batch_size
    assert (s.training.dtype, s.training.mixed_precision_param, s.training.mixed_precision_reduce) == (
        "float32",
        "bfloat16",
        "float32",
    )
    assert (s.parallelism.data_parallel, s.parallelism.tp, s.parallelism.dp_shard) == ("fsdp2", 1, -1)
    from titan_core.launcher import cpu_count

    assert 1 <= s.device.threads <= max(1, cpu_count() // 2)
    assert cfg.training.batch_size == 4 and cfg.parallelism.data_parallel == "simple_fsdp"  # the input is untouched


def test_curve_max_rel_finds_the_worst_step_and_refuses_short_curves():
    ref = [2.0] * gate_recipe.param("simple_fsdp", "steps")
    curve = list(ref)
    curve[6] = 2.03
    worst, step = curve_max_rel(curve, ref)
    assert step == 7 and worst == pytest.approx(0.015)
    assert curve_max_rel(curve[:-1], ref) == (math.inf, None)  # the bf16 run stopped early
    curve[3] = float("nan")
    assert curve_max_rel(curve, ref) == (math.inf, 4)


def test_measurements_judged_by_the_checklist(tmp_path):
    """The rung's numbers through the real checklist: W x too large a gradient fails, and only that."""
    n = gate_recipe.param("simple_fsdp", "steps")
    fp32 = rows([7.0 - 0.1 * i for i in range(n)], norm=6.0)
    bf16 = rows([7.0 - 0.1 * i + 0.01 for i in range(n)])
    # the runs' part of the record, as the flat dict the ledger stores, with the rest of the record's fields
    m = dict(simple_fsdp.measure(fp32, bf16, rows([7.0] * n), baseline=(7.0, 3.0), eager_evidence=None, steps=n))
    m["world_size"] = 2
    m["runs_whole"] = True  # the engine's, from the runs the rung recorded (contract.settle_runs)
    m.update(parallel_degrees.measure([], 0.0), precision="fp32")  # a recipe asking no ep, cp or pp
    results = {r["name"]: r for r in evaluate(load_checklist("simple_fsdp"), m)}
    assert not results["step1_grad_norm"]["ok"] and results["step1_grad_norm"]["value"] == 1.0
    assert "Partial" in results["step1_grad_norm"]["hint"]
    assert [name for name, r in results.items() if not r["ok"]] == ["step1_grad_norm"]
    assert m["bf16_loss_curve_max_rel"] == pytest.approx(0.01 / 5.1)
    assert m["fsdp2_step1_loss_rel_err"] == 0.0 and m["fsdp2_over_simple_fsdp_step_time"] == 1.0
    # two launches timed apart: context, with no interval and no outcome
    assert m["fsdp2_vs_simple_fsdp_context"].startswith("context (timed apart, no interval): FSDP2's median step")
    assert "CI" not in m["fsdp2_vs_simple_fsdp_context"] and "faster" not in m["fsdp2_vs_simple_fsdp_context"]
    m = simple_fsdp.measure(rows([7.0] * n, norm=3.0), bf16, [], baseline=(7.0, 3.0), eager_evidence=None, steps=n)
    assert m["fsdp2_step_time_median_s"] is None  # FSDP2 failed: recorded, not judged
    assert gate_passed(evaluate(load_checklist("simple_fsdp"), {**m, "world_size": 2, "bf16_loss_curve_max_rel": 0,
                                                                "runs_whole": True, "precision": "fp32",
                                                                **parallel_degrees.measure([], 0.0)}))  # fmt: skip


def test_every_criterion_names_a_metric_the_rung_measures():
    n = gate_recipe.param("simple_fsdp", "steps")
    m = simple_fsdp.measure(
        rows([7.0] * n), rows([7.0] * n), [], baseline=(7.0, 3.0), eager_evidence=EVIDENCE["eager"], steps=n
    )
    measured = set(m) | {"world_size", "global_batch_size", "batch_size_per_rank", "baseline", "baseline_why"}
    measured |= {"runs_whole"}  # set by the engine from the runs the rung recorded (contract.settle_runs)
    measured |= set(parallel_degrees.measure([], 0.0))  # onboard/rungs/parallel_degrees.py, whatever the recipe asks
    assert {c.metric for c in load_checklist("simple_fsdp").criteria} <= measured


def test_bf16_is_kept_only_when_faster_and_on_the_fp32_curve(debug_ws, tmp_path):
    from titan_core.measure.timing import compare

    ctx = ctx_for(debug_ws, tmp_path)
    faster = compare(lambda: 0.1, lambda: 0.2)  # bf16 steps, fp32 steps: noiseless, twice as fast
    tie = compare(lambda: 0.2, lambda: 0.2)
    m = {"bf16_loss_curve_max_rel": 0.001,
         "fsdp2_vs_simple_fsdp_context": timed_apart(0.14, 0.2, "SimpleFSDP", "FSDP2")}
    edits, choice, (d,) = simple_fsdp.recipe_choices(ctx, None, m, timing=faster)
    assert [(e.key, e.value) for e in edits] == [("training.mixed_precision_param", "bfloat16")]
    assert "is faster than training.mixed_precision_param=float32: 2.00x" in choice["mixed_precision_why"]
    assert (d["verdict"], d["speedup"]) == ("kept", 2.0)
    edits, choice, _ = simple_fsdp.recipe_choices(ctx, None, {**m, "bf16_loss_curve_max_rel": 0.5}, timing=faster)
    assert (
        edits == [] and choice["mixed_precision_choice"] == "float32" and "loss curve" in choice["mixed_precision_why"]
    )
    edits, choice, _ = simple_fsdp.recipe_choices(ctx, None, m, timing=tie)  # indistinguishable: fp32 stands
    assert edits == [] and choice["mixed_precision_choice"] == "float32"
    assert choice["data_parallel_choice"] == "simple_fsdp" and "FSDP2" in choice["data_parallel_why"]


def test_precisions_are_timed_interleaved_in_one_process(debug_ws, tmp_path):
    from titan_core.measure.timing import TimingProtocol

    ctx = ctx_for(debug_ws, tmp_path)
    base = gate_recipe.job_config(ctx)
    base.training.batch_size, base.training.seq_len = 2, 16
    cmp = simple_fsdp.time_precisions(ctx, base)
    protocol = TimingProtocol.from_dict(gate_recipe.param("simple_fsdp", "timing"))
    assert cmp.paired and cmp.rounds >= protocol.min_rounds
    check_comparison(cmp, protocol.min_effect)  # the outcome is the one its interval gives
