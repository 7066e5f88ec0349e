"""The profile breakdown of a training step (onboard.rungs.tuning_rung.profile): on a narrow llama3
Trainer the categories plus the host gaps add up to the step time measured outside the profiler
within the checklist's stated tolerance, each category holds the ops it names, the trace file is
written, and the biggest category comes with its lever."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)

from core_bounds import PROFILE_SUM_REL
from titan_core.training.trainer import Trainer
from onboard.rungs.tuning_rung.profile import CATEGORIES, LEVERS, STEP_MARK, breakdown_of, category_of, profile_steps
from tiny_jobs import narrow_config

TOLERANCE = PROFILE_SUM_REL  # checklists/tuning.yaml params.profile_sum_tolerance
# the profile times ops: beside the background climbs a tiny model's matmuls fell out of its ten
# slowest ops (DTensor redistributes and elementwise ops took longer), so the climbs pause
pytestmark = pytest.mark.whole_machine


@pytest.fixture(scope="module")
def breakdown(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    trainer = Trainer(narrow_config(out), quiet=True)
    try:
        for _ in range(2):  # warm: the breakdown is of steady steps
            trainer.train_step()
        return profile_steps(trainer.train_step, steps=3, trace_path=out / "trace.json"), out
    finally:
        trainer.close()


def test_categories_sum_to_the_step_time(breakdown):
    b, _ = breakdown
    assert b.steps == 3 and set(b.seconds) == set(CATEGORIES) and b.timeline == "host"
    # the categories are means over the profiled steps, so they partition the mean wall time; the
    # reported step time is the median, which a step the machine stole time from does not move
    assert abs(sum(b.seconds.values()) - b.wall_mean_s) <= TOLERANCE * b.wall_mean_s, (b.seconds, b.wall_mean_s)
    assert min(b.wall_mean_s, b.step_time_s) > 0
    assert b.sum_rel_err <= TOLERANCE
    assert sum(b.fractions.values()) == pytest.approx(1.0)
    # a train step of a transformer with AdamW: matmuls, attention, elementwise work and the optimizer all show
    assert all(b.seconds[c] > 0 for c in ("matmul", "attention", "norms_elementwise", "optimizer", "host_gaps"))
    assert b.seconds["communication"] == 0.0  # one process: no collective ran


def test_top_ops_trace_and_lever(breakdown):
    b, out = breakdown
    assert b.biggest in CATEGORIES and b.lever == LEVERS[b.biggest]
    assert b.biggest == max(b.seconds, key=b.seconds.get)
    ops = {o["op"]: o for o in b.top_ops}
    assert len(b.top_ops) == 10 and "aten::mm" in ops and ops["aten::mm"]["category"] == "matmul"
    # the ops of most self time, most first; each category's share of them is part of that category's time
    times = [o["self_s_per_step"] for o in b.top_ops]
    assert times == sorted(times, reverse=True) and times[-1] > 0
    for cat in {o["category"] for o in b.top_ops}:
        assert sum(o["self_s_per_step"] for o in b.top_ops if o["category"] == cat) <= b.seconds[cat] * (1 + 1e-9)
    trace = json.loads((out / "trace.json").read_text())
    assert b.trace_path == str(out / "trace.json") and trace["traceEvents"]
    assert b.describe().startswith(f"{b.step_time_s * 1e3:.0f} ms/step") and b.biggest in b.describe()


@pytest.mark.parametrize(
    "name, category",
    [
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("autograd::engine::evaluate_function: MmBackward0", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("ScaledDotProductFlashAttentionForCpuBackward0", "attention"),
        ("Optimizer.step#AdamW.step", "optimizer"),
        ("aten::_foreach_mul_", "optimizer"),
        ("c10d::allreduce_", "communication"),
        ("_c10d_functional::wait_tensor", "communication"),
        ("aten::mul", None),
        ("aten::mmul_made_up", None),
        ("aten::rms_norm", None),
    ],
)
def test_category_of_op_names(name, category):
    assert category_of(name) == category


def _event(name: str, start_us: float, end_us: float, children=()):
    self_us = (end_us - start_us) - sum(c.time_range.end - c.time_range.start for c in children)
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start_us, end=end_us),
                           self_cpu_time_total=self_us, cpu_children=list(children))  # fmt: skip


def test_a_step_the_machine_slowed_does_not_read_as_unaccounted_time():
    # three steps of 10, 30 and 32 ms, 8 ms of matmul each: the median (30 ms) is not what the
    # per-step means of the categories add up to; the mean of the same steps (24 ms) is
    lengths_us = (10_000.0, 30_000.0, 32_000.0)
    events, t = [], 0.0
    for length in lengths_us:
        events.append(_event(STEP_MARK, t, t + length, [_event("aten::mm", t + 1_000, t + 9_000)]))
        t += length + 500
    b = breakdown_of(events, [x / 1e6 for x in lengths_us])
    assert b.steps == 3 and b.step_time_s == pytest.approx(0.030) and b.wall_mean_s == pytest.approx(0.024)
    assert b.seconds["matmul"] == pytest.approx(0.008) and b.seconds["host_gaps"] == pytest.approx(0.016)
    assert b.sum_rel_err == pytest.approx(0.0, abs=1e-12)
    # time the events do not hold (a step's ops the profiler missed) still shows
    short = breakdown_of(events, [x / 1e6 * 1.5 for x in lengths_us])
    assert short.sum_rel_err == pytest.approx(1 / 3)
