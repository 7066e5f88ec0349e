"""metrics.tensorboard: every logged scalar as TensorBoard events, read back with TensorBoard's own reader."""

from __future__ import annotations

import importlib.util

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from held_out_data import make_cfg, write_corpus

from titan_core.config.loader import ConfigError
from titan_core.measure.metrics import MetricsLogger
from titan_core.measure.numerics import rel
from titan_core.train import run

SCALARS = ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "peak_mem_bytes", "step_time_s",
           "val_loss", "val_ppl", "val_tokens")  # fmt: skip


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path)


def events(folder) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return acc


def test_every_logged_scalar_is_in_the_event_file(corpus):
    result = run(make_cfg(corpus, "--metrics.tensorboard", steps=3, freq=2), quiet=True)
    rows = {r["step"]: r for r in result.metrics}
    folder = corpus / "out" / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    acc = events(folder)
    assert set(acc.Tags()["scalars"]) == set(SCALARS)
    for tag in SCALARS:
        got = {e.step: e.value for e in acc.Scalars(tag)}
        want = {s: r[tag] for s, r in rows.items() if tag in r}
        assert sorted(got) == sorted(want) == ([2, 3] if tag.startswith("val_") else [1, 2, 3]), tag
        # events store float32
        assert all(rel(got[s], want[s]) <= 1e-6 for s in want), (tag, got, want)


def test_only_an_enabled_logger_writes_events(tmp_path):
    row = {"step": 1, "loss": 2.5, "grad_norm": 1.0, "lr": 1e-3}
    quiet_rank = MetricsLogger(tmp_path / "r1", enabled=False, console=False, tensorboard=True)
    quiet_rank.log(row)
    quiet_rank.close()
    assert not (tmp_path / "r1").exists()
    rank0 = MetricsLogger(tmp_path / "r0", console=False, tensorboard=True)
    rank0.log(row)
    rank0.close()  # the events are flushed here
    assert [(e.step, e.value) for e in events(tmp_path / "r0" / "tensorboard").Scalars("loss")] == [(1, 2.5)]


def test_a_missing_tensorboard_package_is_a_config_error_naming_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the tensorboard package.*titan-onboard\[tb\]"):
        MetricsLogger(tmp_path, tensorboard=True, enabled=False)  # every rank checks, not only the writer
    MetricsLogger(tmp_path, tensorboard=False)  # off: nothing asked of the package
