"""The tuning rung's Decision of each change (tuning_decisions), on scripted classes and comparisons:
the change takes the lever only when faster than the recipe it would change and its numerics allow;
a diverged change is not eligible untimed, a faster rounding change whose curve left the holder's is
not eligible with its timing kept, and a `faster` without a finite interval is not measured."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from onboard.rungs.tuning_rung.classify import Classification, CurveCheck
from onboard.rungs.tuning_rung.decisions import change_decision, keep_rule, lever_of
from titan_core.config.loader import from_dict
from titan_core.measure.timing import Comparison

HOLDER = from_dict({"training": {"batch_size": 4, "grad_accum": 2}, "kernels": {"ce_chunk": 1024}})
NO_LEDGER = SimpleNamespace(attempts=[])


def cls(name: str) -> Classification:
    return Classification(name, 0.0 if name == "bit_identical" else 1e-6, 0.0, 1e-5, f"{name} on step 1")


def cmp(ratio: float, outcome: str, ci_high: float | None = None) -> Comparison:
    return Comparison(outcome, ratio, ratio / 1.02, ci_high or ratio * 1.02, 0.99, 9, "interval", ratio, 1.0)


def decided(c, timing, curve=None, *, step="block_sizes", values=None, ledger=NO_LEDGER):
    kept, why = keep_rule(c, timing, curve)
    d = change_decision(ledger, step=step, label="ce_chunk=2048", values=values or {"kernels.ce_chunk": 2048},
                        holder_cfg=HOLDER, holder_label="untuned", cls=c, cmp=timing, kept=kept, why=why)  # fmt: skip
    return kept, d


def test_a_faster_bit_identical_change_is_kept_with_its_figure():
    kept, d = decided(cls("bit_identical"), cmp(0.5, "faster"))
    assert kept and (d.lever, d.holder, d.candidate, d.value, d.verdict) == (
        "kernels.ce_chunk", 1024, 2048, 2048, "kept")  # fmt: skip
    assert d.speedup == pytest.approx(2.0) and d.ci[0] > 1 and d.rounds == 9


def test_an_indistinguishable_change_leaves_the_holder():
    kept, d = decided(cls("bit_identical"), cmp(1.0, "indistinguishable"))
    assert not kept and (d.verdict, d.value) == ("indistinguishable", 1024)


def test_a_diverged_change_is_not_eligible_and_never_timed():
    kept, d = decided(cls("diverged"), None)
    assert not kept and (d.verdict, d.figure, d.speedup, d.value) == ("not eligible", "none", None, 1024)
    assert "rejected" in d.why


def test_a_faster_rounding_change_whose_curve_left_is_not_eligible_with_its_timing():
    curve = CurveCheck(ok=False, worst_rel=1e-3, worst_step=4, steps=10, tolerance=1e-5)
    kept, d = decided(cls("rounding"), cmp(0.5, "faster"), curve)
    assert not kept and (d.verdict, d.value, d.reverses) == ("not eligible", 1024, None)
    assert d.speedup == pytest.approx(2.0) and "loss curve" in d.why


def test_faster_without_a_finite_interval_is_not_measured_and_not_kept():
    kept, d = decided(cls("bit_identical"), cmp(0.5, "faster", ci_high=math.inf))
    assert not kept and (d.verdict, d.value, d.speedup) == ("not measured", 1024, None)


def test_a_reversal_of_an_earlier_rungs_value_is_named():
    entry = SimpleNamespace(rung="kernels", status="passed", recipe_edit={"edits": [{"key": "kernels.ce_chunk"}]})
    _, d = decided(cls("bit_identical"), cmp(0.5, "faster"), ledger=SimpleNamespace(attempts=[entry]))
    assert d.reverses == "kernels" and "reverses the kernels rung's kernels.ce_chunk=1024" in d.why


def test_the_lever_of_a_batch_and_of_a_flag():
    values = {"training.batch_size": 8, "training.grad_accum": 1}
    assert lever_of("batch", "batch=8", values, HOLDER) == ("training.batch_size", "4x2", "8", "training.batch_size")
    two = {"graph_trainer.compile": "inductor", "tpu.libtpu_init_flags": "--x"}
    assert lever_of("flags", "graph_trainer.inductor", two, HOLDER)[:3] == ("graph_trainer.inductor", "off", "on")
