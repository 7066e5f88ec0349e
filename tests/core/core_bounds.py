"""The numeric bounds titan_core's own tests hold it to, stated here because tests/core runs
without onboard (tests/core/conftest.py blocks it) and the one checklist reader,
onboard.ladder.gates, is onboard's.

Each bound is the number of the checklist entry named in SOURCES (checklists/<rung>.yaml, the
thresholds of DESIGN.md section 5): titan_core is held to exactly the bound the onboarding gate
applies to a model, never a looser one. tests/onboard/e2e/test_core_bounds.py reads every entry
through onboard.ladder.gates and fails when a number here differs, so the two cannot drift.
"""

from __future__ import annotations

FSDP_LOSS_REL = 1.0e-6
"""fp32 step-1 loss, sharded (or accumulated) vs one plain process: summation order only."""
FSDP_GRAD_NORM_REL = 1.0e-6
"""fp32 step-1 gradient norm, sharded (or accumulated) vs one plain process."""
BF16_LOSS_CURVE_REL = 2.0e-2
"""Worst step of a bf16-parameter loss curve vs the fp32 curve."""
KERNEL_FP32_REL = 1.0e-5
"""A fused kernel's output and gradients vs the plain PyTorch path, relative L2 in fp32."""
PARITY_SEQ_LEN = 512
"""The shortest sequence a comparison with HF transformers runs at (RoPE and window bugs hide in short ones)."""
PARITY_LOGITS_REL_L2 = 1.0e-5
"""Native vs HF logits, relative L2, fp32."""
PARITY_LOGITS_MAX_ABS = 1.0e-4
"""Native vs HF logits, largest absolute difference, fp32."""
PARITY_LOSS_ABS = 1.0e-5
"""Native vs HF cross-entropy, absolute difference, fp32."""
PARITY_GRAD_REL_L2 = 1.0e-4
"""Native vs HF gradients (mapped to HF names), worst parameter's relative L2, fp32."""
PROFILE_SUM_REL = 0.1
"""A profile's categories plus host gaps vs the step time measured outside the profiler."""

# name -> (rung, "criterion" or "param", entries): where in checklists/ each number above is stated
SOURCES = {
    "FSDP_LOSS_REL": ("simple_fsdp", "criterion", "step1_loss"),
    "FSDP_GRAD_NORM_REL": ("simple_fsdp", "criterion", "step1_grad_norm"),
    "BF16_LOSS_CURVE_REL": ("simple_fsdp", "criterion", "bf16_loss_curve"),
    "KERNEL_FP32_REL": ("kernels", "criterion", "loss", "logits", "grads"),
    "PARITY_SEQ_LEN": ("parity", "criterion", "seq_len"),
    "PARITY_LOGITS_REL_L2": ("parity", "criterion", "logits_rel_l2"),
    "PARITY_LOGITS_MAX_ABS": ("parity", "criterion", "logits_max_abs"),
    "PARITY_LOSS_ABS": ("parity", "criterion", "loss_abs_diff"),
    "PARITY_GRAD_REL_L2": ("parity", "criterion", "grad_max_rel_l2"),
    "PROFILE_SUM_REL": ("tuning", "param", "profile_sum_tolerance"),
}
