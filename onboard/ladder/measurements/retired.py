"""Measurements older ledgers may hold that no rung writes now, and how a reader shows the rest.

Until the timing rule that no unpaired figure carries an outcome (DESIGN section 7), the compile,
graph_trainer, tuning and simple_fsdp rungs put an interval and faster / slower on two runs timed
apart (titan_core.measure.timing.compare_samples). Until the ledger kept floats as they are, the
rungs also wrote each exact float a second time as its repr string. Their ledgers stay readable: the
evidence checks ignore names they do not know, no rung reads a retired name, and every reader that
shows measurements goes through `shown_measurements`, so none prints such a figure again.
"""

from __future__ import annotations

from typing import Any

UNPAIRED = frozenset({"vs_eager", "vs_eager_text", "speedup_vs_eager_ci", "fsdp2_vs_simple_fsdp"})
"""Measurements that carried an unpaired interval and outcome (their context now: speedup_vs_eager,
vs_eager_context, fsdp2_vs_simple_fsdp_context)."""
REPR_COPIES = frozenset({
    # eager
    "step1_loss_repr", "step1_grad_norm_repr", "last_loss_repr", "fp32_step1_loss_repr", "fp32_step1_grad_norm_repr",
    "step1_loss_compared_repr", "step1_loss_transformers_repr",
    # parity
    "native_loss_repr", "upstream_loss_repr", "native_aux_loss_repr", "upstream_aux_loss_repr",
    # simple_fsdp and compile (step1_loss_repr, step1_grad_norm_repr above too)
    "baseline_step1_loss_repr", "baseline_step1_grad_norm_repr",
    # tuning (step1_loss_repr above too)
    "final_step1_loss_repr", "final_step1_grad_norm_repr", "untuned_step1_loss_repr", "untuned_step1_grad_norm_repr",
})  # fmt: skip
"""Measurements that repeated a float as its repr string: JSON keeps a float exactly (json.dumps writes its
repr), so the float under the name without `_repr` is the measurement now (an older simple_fsdp, compile,
parity or tuning entry has only the copy; nothing reads it)."""
RETIRED = UNPAIRED | REPR_COPIES
"""Every retired measurement: left out wherever measurements are shown."""
UNPAIRED_QUOTED = "not shown: an older onboard quoted an interval on two runs timed apart here"
"""What a reader shows instead of a recorded line that quotes such a comparison (data_parallel_why
quoted fsdp2_vs_simple_fsdp; the comparison's own line said "unpaired")."""


def shown_measurements(measurements: dict[str, Any]) -> dict[str, Any]:
    """The measurements a reader shows: RETIRED names left out, and a recorded line that quotes an
    unpaired comparison replaced by UNPAIRED_QUOTED."""
    return {k: UNPAIRED_QUOTED if isinstance(v, str) and "unpaired" in v else v
            for k, v in measurements.items() if k not in RETIRED}  # fmt: skip
