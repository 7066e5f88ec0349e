"""Measurements older ledgers may hold that no rung writes now, and how a reader shows the rest.

Until the timing rule that no unpaired figure carries an outcome (DESIGN section 7), the compile,
graph_trainer, tuning and simple_fsdp rungs put an interval and faster / slower on two runs timed
apart (titan_core.measure.timing.compare_samples). Their ledgers stay readable: the evidence checks
ignore names they do not know, and every reader that shows measurements goes through
`shown_measurements`, so none prints such a figure again.
"""

from __future__ import annotations

from typing import Any

RETIRED = frozenset({"vs_eager", "vs_eager_text", "speedup_vs_eager_ci", "fsdp2_vs_simple_fsdp"})
"""Measurements that carried an unpaired interval and outcome: left out wherever measurements are
shown (their context now: speedup_vs_eager, vs_eager_context, fsdp2_vs_simple_fsdp_context)."""
UNPAIRED_QUOTED = "not shown: an older onboard quoted an interval on two runs timed apart here"
"""What a reader shows instead of a recorded line that quotes such a comparison (data_parallel_why
quoted fsdp2_vs_simple_fsdp; the comparison's own line said "unpaired")."""


def shown_measurements(measurements: dict[str, Any]) -> dict[str, Any]:
    """The measurements a reader shows: RETIRED names left out, and a recorded line that quotes an
    unpaired comparison replaced by UNPAIRED_QUOTED."""
    return {k: UNPAIRED_QUOTED if isinstance(v, str) and "unpaired" in v else v
            for k, v in measurements.items() if k not in RETIRED}  # fmt: skip
