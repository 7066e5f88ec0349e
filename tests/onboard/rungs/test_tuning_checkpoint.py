"""The tuning rung's activation-checkpointing step (onboard/rungs/tuning_rung/recompute.py) on a stand-in
tuner: when it is tried, the order of the modes, the numerics proof at the holder's batch before the
larger batch, the memory limit, and the first kept mode ending the step. The step on a real workspace
runs in tests/onboard/e2e/test_tuning_rung.py."""

from __future__ import annotations

from types import SimpleNamespace

from onboard.rungs.tuning_rung.recompute import bigger, kept_not_exact, try_checkpointing
from onboard.rungs.tuning_rung.search import BatchShape
from titan_core.config.sections import JobConfig


class StandInTuner:
    """What the step reads of the Tuner: runs (probe, peak, keep_only), classify, trial, note, the holder."""

    def __init__(self, classes: dict[str, str], peaks: dict[str, int], kept: set[str]):
        self.cfg, self.holder, self.notes, self.logged, self.probed, self.timed = JobConfig(), "untuned", [], [], [], []
        self.cfg.training.batch_size, self.cfg.training.grad_accum = 4, 2
        self.classes, self.kept = classes, kept
        self.ctx = SimpleNamespace(log=self.logged.append)
        self.runs = SimpleNamespace(probe=lambda label, cfg: self.probed.append((label, cfg)), peak=peaks,
                                    keep_only=lambda label: None)  # fmt: skip

    def classify(self, label, cfg, against, against_cfg):
        cls = self.classes[label]
        return SimpleNamespace(cls=cls, to_dict=lambda: {"cls": cls}), against

    def trial(self, step, label, values):
        self.timed.append(label)
        kept = label in self.kept
        return {"kept": kept, "why": "faster" if kept else "not faster", "class": "rounding"}

    def note(self, step, what, why, **extra):
        self.notes.append((what, why))


MEMORY = {"stopped": "memory", "limit_bytes": 1000}


def test_the_batch_it_would_buy():
    assert bigger(BatchShape(4, 2), fixed_global=True) == BatchShape(8, 1)
    assert bigger(BatchShape(4, 1), fixed_global=True) is None  # one micro-batch of a fixed global batch
    assert bigger(BatchShape(4, 1), fixed_global=False) == BatchShape(8, 1)


def test_not_tried_unless_memory_ended_the_batch_search_or_under_the_graph_trainer():
    t = StandInTuner({}, {}, set())
    out = try_checkpointing(t, {"stopped": "throughput", "limit_bytes": 1000}, fixed_global=False, precision="fp32")
    assert not out["tried"] and "stopped on throughput" in out["why"] and t.probed == []
    t.cfg.graph_trainer.enable = True
    out = try_checkpointing(t, MEMORY, fixed_global=False, precision="fp32")
    assert not out["tried"] and "memory policy decides" in out["why"] and t.probed == []


def test_each_mode_is_proved_exact_first_then_must_fit_and_the_first_kept_ends_the_step():
    classes = {"ac=selective": "bit_identical", "ac=full": "bit_identical"}
    peaks = {"ac=selective,batch=8x2": 1500, "ac=full,batch=8x2": 900}  # selective does not fit, full does
    t = StandInTuner(classes, peaks, kept={"ac=full,batch=8x2"})
    out = try_checkpointing(t, MEMORY, fixed_global=False, precision="fp32")
    sel, full = out["modes"]["selective"], out["modes"]["full"]
    assert [p[0] for p in t.probed] == ["ac=selective", "ac=selective,batch=8x2", "ac=full", "ac=full,batch=8x2"]
    assert t.probed[1][1].training.batch_size == 8 and t.probed[1][1].activation_checkpoint.mode == "selective"
    assert not sel["kept"] and "over the limit" in sel["why"] and t.timed == ["ac=full,batch=8x2"]
    assert full["kept"] and kept_not_exact(out, "fp32") == 0
    # a kept mode whose proof was not exact is what the gate counts
    assert kept_not_exact({"modes": {"full": {**full, "same_batch_class": "rounding"}}}, "fp32") == 1
    assert kept_not_exact({"modes": {"full": {**full, "same_batch_class": "rounding"}}}, "bf16") == 0


def test_a_mode_that_changes_step_1_at_the_same_batch_is_never_run_larger():
    t = StandInTuner({"ac=selective": "rounding", "ac=full": "diverged"}, {}, set())
    out = try_checkpointing(t, MEMORY, fixed_global=False, precision="fp32")
    assert [p[0] for p in t.probed] == ["ac=selective", "ac=full"] and t.timed == []
    assert all(not r["kept"] and "not bit_identical" in r["why"] for r in out["modes"].values())
