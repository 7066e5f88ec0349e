"""The machine's load in view of every comparison: recorded beside the answer, never deciding it
(interleaved rounds share it); an interval that is not finite is `not measured`; the /proc probe sees other processes' CPU
and not this process's own (nor its descendants')."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from timing_checks import check_comparison

from titan_core.runtime import cpu_load
from titan_core.runtime.cpu_load import LoadSnapshot
from titan_core.measure.timing import NOT_MEASURED, TimingProtocol, _result, compare


def _window(foreign: float, load=(0.5, 0.5), own_cores: float = 1.0, wall: float = 10.0) -> list[LoadSnapshot]:
    """The probe's two snapshots around one comparison on a 4-core machine where other processes
    held `foreign` cores and this one `own_cores`, on average over `wall` seconds."""
    before = LoadSnapshot(wall_s=100.0, busy_s=500.0, cores=4, tick_s=0.01, own_s=20.0, load_1m=load[0])
    after = LoadSnapshot(wall_s=100.0 + wall, busy_s=500.0 + (foreign + own_cores) * wall, cores=4, tick_s=0.01,
                         own_s=20.0 + own_cores * wall, load_1m=load[1])  # fmt: skip
    return [before, after]


def _probe(*windows: list[LoadSnapshot]):
    """A scripted probe: the snapshots of `windows` in order; a call past them fails the test."""
    return iter([s for w in windows for s in w]).__next__


def _samplers(seed: int = 0, cand: float = 0.2, base: float = 0.1):
    rng = random.Random(seed)
    return (lambda: cand * math.exp(rng.gauss(0, 0.02))), (lambda: base * math.exp(rng.gauss(0, 0.02)))


def test_another_process_on_the_cores_decides_nothing_and_is_said():
    # both sides' interleaved rounds ran under the foreign load: the paired ratio still decides
    c = compare(*_samplers(), TimingProtocol(), probe=_probe(_window(2.0)))
    assert c.outcome == "slower" and c.foreign_cores == pytest.approx(2.0) and 1.9 < c.ratio < 2.1
    assert c.load_note == "other processes held 2.00 cores on average: both sides' interleaved rounds ran under it"
    assert "other processes 2.00 cores" in c.describe() and c.to_dict()["load_note"] == c.load_note
    check_comparison(c, TimingProtocol().min_effect)


def test_a_load_average_that_moved_is_said_beside_the_answer():
    rose = compare(*_samplers(), TimingProtocol(), probe=_probe(_window(0.0, load=(0.5, 2.5), own_cores=0.1)))
    assert rose.outcome == "slower" and rose.load_note.startswith("the 1-minute load average rose 0.50 -> 2.50")
    fell = compare(*_samplers(), TimingProtocol(), probe=_probe(_window(0.0, load=(3.0, 1.5))))
    assert fell.outcome == "slower" and "fell 3.00 -> 1.50" in fell.load_note
    assert (rose.load_before, rose.load_after) == (0.5, 2.5)


def test_a_load_rise_this_process_own_threads_explain_is_not_said():
    # 8 busy threads for 30 s pull the 1-minute average up by up to 8 x (1 - e^(-35/60)) = 3.5
    c = compare(*_samplers(), TimingProtocol(), probe=_probe(_window(0.0, load=(0.2, 3.0), own_cores=8.0, wall=30.0)))
    assert c.outcome == "slower" and c.load_note is None
    assert cpu_load.load_rise_own_bound(*_window(0.0, own_cores=8.0, wall=30.0)) == pytest.approx(
        8 * (1 - math.exp(-35 / 60))
    )


def test_a_quiet_machine_has_no_note():
    c = compare(*_samplers(), TimingProtocol(), probe=_probe(_window(0.1)))
    assert c.load_note is None and "other processes 0.10 cores" in c.describe()


def test_an_interval_that_is_not_finite_is_not_measured():
    # two rounds whose ratios differ by e^40: the t interval on 1 degree of freedom overflows exp
    ratios = iter([math.exp(20), math.exp(-20)])
    c = compare(lambda: next(ratios), lambda: 1.0, TimingProtocol(warmup=0, min_rounds=2, max_rounds=2),
                probe=_probe(_window(0.0)))  # fmt: skip
    assert c.rounds == 2 and (c.ci_low, c.ci_high) == (0.0, math.inf) and not c.finite
    assert c.outcome == NOT_MEASURED and c.not_measured_why == "the interval (0-inf) is not finite"
    assert "CI" not in c.describe() and c.short() == "not measured (the interval (0-inf) is not finite)"
    check_comparison(c, TimingProtocol().min_effect)
    # a finite interval too wide to say anything is not measured either, and prints no interval
    ratios = iter([8.0, 1 / 8.0])
    wide = compare(lambda: next(ratios), lambda: 1.0, TimingProtocol(warmup=0, min_rounds=2, max_rounds=2),
                   probe=_probe(_window(0.0)))  # fmt: skip
    assert wide.finite and wide.ci_high / wide.ci_low > 100 and wide.outcome == NOT_MEASURED
    assert "too wide to say anything" in wide.not_measured_why and "CI" not in wide.describe()


def test_one_round_has_no_interval_and_is_not_measured():
    # compare always keeps 2 rounds at least; the rule is the result's, for whatever builds one
    c = _result(0.1, -math.inf, math.inf, [0.11], [0.1], TimingProtocol(), "max_seconds", paired=True)
    assert c.outcome == NOT_MEASURED and c.not_measured_why == "1 kept round(s): an interval needs at least 2"
    assert c.short().startswith("not measured") and "CI" not in c.describe()


def test_a_not_measured_answer_must_say_why():
    ratios = iter([math.exp(20), math.exp(-20)])
    c = compare(lambda: next(ratios), lambda: 1.0, TimingProtocol(warmup=0, min_rounds=2, max_rounds=2),
                probe=_probe(_window(0.0)))  # fmt: skip
    with pytest.raises(AssertionError):
        check_comparison({**c.to_dict(), "not_measured_why": None}, TimingProtocol().min_effect)


def test_the_retired_disturbance_limits_are_unknown_keys():
    for key in ("max_foreign_cores", "max_load_change", "retries_when_disturbed"):
        with pytest.raises(ValueError, match="unknown timing protocol keys"):
            TimingProtocol.from_dict({key: 1})


# ---- the probe --------------------------------------------------------------------------------
def test_foreign_cores_needs_proc_stat_and_a_window_its_ticks_resolve():
    before, after = _window(0.7)
    assert cpu_load.foreign_cores(before, after) == pytest.approx(0.7)
    no_stat = LoadSnapshot(wall_s=110.0, busy_s=None, cores=0, tick_s=0.01, own_s=30.0, load_1m=None)
    assert cpu_load.foreign_cores(before, no_stat) is None
    # 4 cores of 10 ms ticks: a window under 0.8 s cannot tell 0.1 core from nothing
    short = LoadSnapshot(wall_s=100.5, busy_s=501.0, cores=4, tick_s=0.01, own_s=20.0, load_1m=0.5)
    assert cpu_load.min_window_s(short) == pytest.approx(0.8) and cpu_load.foreign_cores(before, short) is None
    # own CPU counted ahead of the machine's ticks reads as no one else, never as a negative
    ahead = LoadSnapshot(wall_s=110.0, busy_s=505.0, cores=4, tick_s=0.01, own_s=30.0, load_1m=0.5)
    assert cpu_load.foreign_cores(before, ahead) == 0.0


def test_proc_stat_busy_time_counts_only_our_cores():
    stat = (
        "cpu  1000 0 500 9000 100 0 0 0 0 0\n"
        "cpu0 100 10 50 900 40 5 5 2 30 0\n"  # busy: all but idle and iowait; guest is inside user
        "cpu1 200 0 100 800 0 0 0 0 0 0\n"
        "cpu2 999 0 0 0 0 0 0 0 0 0\n"
        "intr 12345\n"
    )
    assert cpu_load.busy_ticks(stat, {0, 1}) == (100 + 10 + 50 + 5 + 5 + 2 + 200 + 100, 2)
    assert cpu_load.busy_ticks(stat, None) == (172 + 300 + 999, 3)
    assert cpu_load.busy_ticks("cpu  1 2 3 4\n", None) is None


def _fake_proc(root: Path, procs: dict[int, tuple[int, int]], children_files: bool) -> None:
    """A /proc with `procs` {pid: (ppid, ticks)}, each one's ticks split over utime..cstime."""
    for pid, (ppid, ticks) in procs.items():
        d = root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        rest = ["S", str(ppid)] + ["0"] * 9 + [str(ticks - 3), "1", "1", "1"] + ["0"] * 5
        (d / "stat").write_text(f"{pid} (a (weird) name) " + " ".join(rest) + "\n")
        if children_files:
            kids = [str(p) for p, (pp, _) in procs.items() if pp == pid]
            (d / "task" / str(pid) / "children").write_text(" ".join(kids) + (" " if kids else ""))


@pytest.mark.parametrize("children_files", [True, False])
def test_live_descendants_are_this_process_own_work(tmp_path, children_files):
    me = 4242
    procs = {1: (0, 10_000), me: (1, 500), 5000: (me, 300), 5001: (5000, 40), 5002: (1, 7777), 5003: (5002, 9)}
    _fake_proc(tmp_path, procs, children_files)
    assert cpu_load.descendant_ticks(me, tmp_path) == 300 + 40  # not itself, not its siblings' tree
    assert cpu_load.descendant_ticks(5001, tmp_path) == 0


def test_this_process_own_cpu_is_its_own():
    before = cpu_load.snapshot()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:
        pass
    after = cpu_load.snapshot()
    assert after.own_s - before.own_s >= 0.2 and after.wall_s > before.wall_s
