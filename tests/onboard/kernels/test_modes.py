"""onboard.rungs.kernels_rung.modes: a kernel judged in the execution mode the recipe trains in."""

from __future__ import annotations

import importlib.util

import pytest
from one_thread import one_thread  # noqa: F401 (autouse: one intra-op thread, tests/one_thread.py)

from titan_core.kernels import fused_ce
from onboard.rungs.kernels_rung.modes import mode_check
from titan_core.models.registry import resolve_args

HAS_JAX = all(importlib.util.find_spec(m) for m in ("jax", "tokamax"))


def _args(family="llama3"):
    return resolve_args(family, "debugmodel", {"n_layers": 1})


def test_a_clean_kernel_runs_in_every_mode():
    for mode in ("eager", "compile", "graph_trainer"):
        out = mode_check("llama3", _args(), "kernels.loss=fused_ce", mode=mode, seq_len=16)
        assert out["ok"] and out["reason"] is None, out


def test_a_graph_break_inside_a_kernel_is_named(monkeypatch):
    right = fused_ce.FusedCrossEntropyHead.forward

    def breaking(self, hidden, weight, labels):
        hidden = hidden * 1.0  # some graph before the break (a break before any op splits nothing)
        labels.tolist()  # host data in forward: dynamo breaks the graph here
        return right(self, hidden, weight, labels)

    monkeypatch.setattr(fused_ce.FusedCrossEntropyHead, "forward", breaking)
    out = mode_check("llama3", _args(), "kernels.loss=fused_ce", mode="compile", seq_len=16)
    assert not out["ok"] and out["graph_breaks"] >= 1
    assert "graph-breaks" in out["reason"] and "loss_head" in out["reason"] and "\n" not in out["reason"]


def test_a_host_sync_inside_a_kernel_fails_the_captured_mode(monkeypatch):
    right = fused_ce.FusedCrossEntropyHead.forward

    def syncing(self, hidden, weight, labels):
        if labels.max().item() < 0:  # a data-dependent branch: the host must read the device
            labels = labels.clone()
        return right(self, hidden, weight, labels)

    monkeypatch.setattr(fused_ce.FusedCrossEntropyHead, "forward", syncing)
    out = mode_check("llama3", _args(), "kernels.loss=fused_ce", mode="graph_trainer", seq_len=16)
    assert not out["ok"] and out["host_syncs"] >= 1 and "syncs the host" in out["reason"]


@pytest.mark.skipif(not HAS_JAX, reason="needs jax and tokamax (the [jax] extra)")
@pytest.mark.parametrize(
    "family, flag", [("llama3", "kernels.attention=tokamax"), ("qwen3_moe", "kernels.moe=tokamax")]
)
def test_jax_kernels_compile_without_a_break(family, flag):
    """They look their module up when built: an import inside forward broke every block (docs/DESIGN.md section 8)."""
    out = mode_check(family, _args(family), flag, mode="compile", seq_len=16)
    assert out["ok"] and out["graph_breaks"] == 0, out


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown execution mode"):
        mode_check("llama3", _args(), "kernels.loss=fused_ce", mode="jit", seq_len=16)
