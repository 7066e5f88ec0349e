"""Per-block torch.compile: no graph break inside a block, step-1 loss as eager (every family)."""

import math

import pytest
import torch
from _tiny import FAMILIES, batches, build, tiny_cfg

from titan_core.compile import explain_blocks, graph_breaks_total
from titan_core.training.trainer import Trainer


def _step1(cfg) -> tuple[Trainer, float]:
    t = Trainer(cfg, quiet=True)
    t.step = 1
    return t, t.train_step()["loss"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("family", FAMILIES)
def test_no_breaks_and_step1_loss(tmp_path, family):
    model, _ = build(family)
    report = explain_blocks(model, batches(1)[0])
    assert set(report) == {"layers.0", "layers.1", "loss_head"}
    assert graph_breaks_total(report) == 0, report
    assert all(r.graphs == 1 for r in report.values())
    _, eager = _step1(tiny_cfg(family, tmp_path / "e", "--parallelism.data_parallel=none", steps=1))
    t, compiled = _step1(
        tiny_cfg(
            family,
            tmp_path / "c",
            "--parallelism.data_parallel=none",
            "--compile.enable",
            "--compile.backend=aot_eager",
            steps=1,
        )
    )
    assert t.compiled_modules == ["layers.0", "layers.1", "loss_head"]
    assert math.isfinite(compiled) and abs(compiled - eager) <= 1e-5 * abs(eager)


def test_breaks_are_found_with_their_reason():
    """The reference MoE loop (torch.where per expert) breaks the graph: the counter must see it."""
    model, _ = build("qwen3_moe", dense_moe=False)
    report = explain_blocks(model, batches(1)[0])
    assert report["layers.0"].breaks > 0
    assert any(
        "nonzero" in r or "dynamic" in r.lower() or "data-dependent" in r.lower() for r in report["layers.0"].reasons
    ), report["layers.0"].reasons
    assert report["loss_head"].breaks == 0


@pytest.mark.whole_machine  # inductor's compile workers and g++ want both cores
def test_inductor_simple_fsdp(tmp_path):
    """The one inductor test: the default (SimpleFSDP) path, blocks compiled by inductor. One thread, as
    tests/core/unit/test_activation_checkpoint.py's inductor case: its unchecked blocks are these graphs,
    which inductor's FX graph cache then serves it (the thread count is part of the cache key)."""
    one_thread = "--device.threads=1"
    _, eager = _step1(tiny_cfg("llama3", tmp_path / "e", one_thread, steps=1))
    t, compiled = _step1(
        tiny_cfg("llama3", tmp_path / "c", one_thread, "--compile.enable", "--compile.backend=inductor", steps=1)
    )
    assert abs(compiled - eager) <= 1e-5 * abs(eager)
    assert all(getattr(m, "_compiled_call_impl", None) is not None for m in (t.model.layers["0"], t.model.loss_head))
    # blocks reading SimpleFSDP's gathered DTensor parameters trace without a break too
    assert graph_breaks_total(explain_blocks(t.model, batches(1)[0])) == 0
