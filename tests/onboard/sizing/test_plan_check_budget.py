"""`onboard plan --check`'s step budget is predicted at the peak of the dtype the check computes in.

A CPU without bf16 instructions (this project's 2-core test machine is one) multiplies bf16 matrices ~45x
slower than fp32 ones. Predicted with the fp32 peak, a bf16 recipe's check ran steps minutes past
STEP_BUDGET_S (the suite's eight plan checks: 760 CPU-s, against 316 with the bf16 peak). The peaks are
given here, so the test holds on any CPU."""

from __future__ import annotations

import pytest
import torch

import onboard.sizing.plan.check as check
from titan_core.config import from_dict
from titan_core.models.common.stats import flops_per_token
from titan_core.parallel import check_parallelism

SEQ = 2048
FP32_STEP_S = check.STEP_BUDGET_S / 2
"""What a step of the planned sequence is predicted to take at the fp32 peak: inside the budget."""
BF16_SLOWER = 45


def _cfg(precision: str):
    return from_dict({"model": {"family": "llama3", "flavor": "debugmodel"},
                      "training": {"seq_len": SEQ, "batch_size": 1, "dtype": precision,
                                   "mixed_precision_param": precision}})  # fmt: skip


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_bf16_check_is_shrunk_by_the_bf16_peak_and_says_so(monkeypatch, precision):
    cfg = _cfg(precision)
    meta = check._meta(cfg)
    fp32_peak = flops_per_token(meta[0], SEQ) * SEQ / FP32_STEP_S / check.CPU_EFFICIENCY
    peaks = {torch.float32: fp32_peak, torch.bfloat16: fp32_peak / BF16_SLOWER}
    monkeypatch.setattr(check, "measured_cpu_peak", lambda dtype=torch.float32: peaks[dtype])
    shrinks = check.fit_here(cfg, check_parallelism(cfg, 1), meta)
    if precision == "float32":
        assert shrinks == [] and cfg.training.seq_len == SEQ
        return
    [said] = shrinks
    assert said["key"] == "training.seq_len" and said["plan"] == SEQ
    # the longest power-of-two fraction of SEQ whose step the bf16 peak predicts within the budget
    seconds = lambda seq: flops_per_token(meta[0], seq) * seq / (peaks[torch.bfloat16] * check.CPU_EFFICIENCY)
    assert seconds(cfg.training.seq_len) <= check.STEP_BUDGET_S < seconds(2 * cfg.training.seq_len)
    assert said["here"] == cfg.training.seq_len < SEQ // 8
    assert "in bfloat16, past 20 s" in said["why"]
