"""`onboard plan`'s predictions beside published training runs: tokens/s per device and MFU, with the ratio.

Each published run (onboard/sizing/plan/published.py, each with its source: TorchTitan's Llama 3.1 8B
on 8 and 128 H100s, its 70B on 256, its SimpleFSDP pair; MaxText's Llama 3.1 70B and 405B and
Qwen3-235B-A22B on TPU v7x) is re-created on meta, nothing allocated: the model's flavor, the target
from the plan's device table, the published layout, batch, memory policy and execution mode. The ratio
is predicted / published tokens/s per device (no FLOP convention enters). Five rows set the time
model's constants (`calibrates`), one is the reference of a pair; the held-out rows set nothing and are
listed apart, each inside or outside BAND. Prints JSON: the rows, the device table with its sources,
the constants in use, and (--derive) the constants recomputed from the rows. A few seconds on a CPU;
no timing protocol: nothing here is measured.

    python bench/plan_vs_published.py [--derive]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from onboard.sizing.plan.hardware import table_rows  # noqa: E402
from onboard.sizing.plan.published import PUBLISHED, constants_in_use, derive_constants, predicted  # noqa: E402
from onboard.sizing.plan.search import TIE  # noqa: E402

BAND = (0.75, 1.33)
"""The band a held-out predicted / published ratio should fall in."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--derive", action="store_true", help="also recompute the constants from the rows (~10 s)")
    opts = ap.parse_args()
    start = time.perf_counter()
    rows = []
    for row in PUBLISHED:
        print(f"predicting {row.id} ...", file=sys.stderr)
        rows.append(predicted(row))
    held = [r for r in rows if r["held_out"]]
    within = [r["id"] for r in held if BAND[0] <= r["ratio"] <= BAND[1]]
    report = {
        "bench": "plan_vs_published",
        "band": list(BAND),
        "held_out": [r["id"] for r in held],
        "held_out_within_band": within,
        "held_out_outside_band": [r["id"] for r in held if r["id"] not in within],
        "fitted": [r["id"] for r in rows if r["calibrates"]],
        "largest_fitted_error": max(abs(r["ratio"] - 1) for r in rows if r["calibrates"]),
        "tie_margin": TIE,
        "rows": rows,
        "constants": constants_in_use(),
        "hardware": table_rows(),
    }
    if opts.derive:
        report["constants_derived"] = derive_constants()
    report["seconds"] = round(time.perf_counter() - start, 2)
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
