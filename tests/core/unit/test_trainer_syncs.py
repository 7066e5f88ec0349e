"""The training loop reads the device only at the steps it must: a non-log step queues its work
and makes the host wait for nothing, yet every step keeps its exact row and a non-finite loss
still stops the run with the message naming its own step.

On a CPU nothing is asynchronous, so the waits are counted where they would happen on an
accelerator: every read of a tensor's value on the host (`.item()`, `.tolist()`, `float(t)`,
`int(t)`, `bool(t)`) made by titan_core's code, and every `devices.synchronize`.
"""

from __future__ import annotations

import math
import sys
from collections import Counter

import torch

from titan_core.config import load_config
from titan_core.measure.metrics import read_metrics
from titan_core.runtime import devices
from titan_core.training.trainer import Trainer

TINY = [
    "--model.overrides={n_layers = 1, dim = 32, n_heads = 2, n_kv_heads = 1, ffn_hidden_dim = 64, vocab_size = 128}",
    "--training.batch_size=2",
    "--training.seq_len=16",
    "--training.steps=10",
    "--training.deterministic",
    "--device.type=cpu",
    "--metrics.rich=false",
]
READS = ("item", "tolist", "__float__", "__int__", "__bool__")
TITAN_CORE = str(devices.__file__).rsplit("/runtime/", 1)[0]


def _trainer(tmp_path, *extra, quiet: bool = True) -> Trainer:
    return Trainer(load_config(None, [*TINY, f"--metrics.output_dir={tmp_path}", *extra]), quiet=quiet)


def _count_syncs(monkeypatch, trainer: Trainer) -> Counter:
    """{step: host reads + device synchronizations made while the trainer was at that step}."""
    syncs: Counter = Counter()

    def counted(original, from_anywhere: bool):
        def wrapper(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if from_anywhere or caller.startswith(TITAN_CORE):
                syncs[trainer.step] += 1
            return original(*args, **kwargs)

        return wrapper

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name), False))
    monkeypatch.setattr(devices, "synchronize", counted(devices.synchronize, True))
    return syncs


def test_only_the_log_steps_read_the_device_and_every_row_stays_exact(tmp_path, monkeypatch):
    every = _trainer(tmp_path / "every").train()  # log_freq 1: a read after each step
    trainer = _trainer(tmp_path / "fourth", "--metrics.log_freq=4", quiet=False)
    syncs = _count_syncs(monkeypatch, trainer)
    result = trainer.train()
    monkeypatch.undo()
    # the first step, every 4th and the last: one read each, of all the steps queued since the last
    assert dict(syncs) == {1: 1, 4: 1, 8: 1, 10: 1}
    assert [r["step"] for r in result.metrics] == list(range(1, 11))
    assert [r["loss"] for r in result.metrics] == [r["loss"] for r in every.metrics]
    assert [r["grad_norm"] for r in result.metrics] == [r["grad_norm"] for r in every.metrics]
    times = [r["step_time_s"] for r in result.metrics]
    assert len(set(times)) == 10 and all(t > 0 for t in times)  # each step timed on its own, not a window mean
    assert read_metrics(tmp_path / "fourth" / "metrics.jsonl") == result.metrics  # every step's line, exact


def test_a_checkpoint_step_and_the_profiler_window_are_read(tmp_path, monkeypatch):
    trainer = _trainer(
        tmp_path,
        "--metrics.log_freq=100",
        "--checkpoint.enable",
        "--checkpoint.interval=3",
        "--profiler.enable",
        "--profiler.start_step=5",
        "--profiler.num_steps=2",
    )
    syncs = _count_syncs(monkeypatch, trainer)
    trainer.train()
    monkeypatch.undo()
    reads = {step for step in syncs if syncs[step]}
    assert {1, 3, 5, 6, 9, 10} <= reads and not reads & {2, 4, 7, 8}


def test_a_non_finite_loss_between_reads_stops_the_run_naming_its_own_step(tmp_path):
    each = _trainer(tmp_path / "each", "--optimizer.lr=1e9").train()
    late = _trainer(tmp_path / "late", "--optimizer.lr=1e9", "--metrics.log_freq=4").train()
    bad = each.metrics[-1]["step"]
    last = each.metrics[-1]
    # a non-finite loss, or a non-finite grad norm (whose clipping makes every weight NaN) one step earlier
    assert not (math.isfinite(last["loss"]) and math.isfinite(last["grad_norm"])) and bad in (2, 3)
    quantity = "loss" if not math.isfinite(last["loss"]) else "grad norm"
    assert late.stopped == each.stopped and late.stopped.startswith(f"training diverged: the {quantity} at step {bad} is ")
    assert [r["step"] for r in late.metrics] == list(range(1, bad + 1))  # the rows end where it diverged
    assert [repr(r["loss"]) for r in late.metrics] == [repr(r["loss"]) for r in each.metrics]
