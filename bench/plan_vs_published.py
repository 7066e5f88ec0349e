"""`onboard plan`'s predictions beside published training runs: tokens/s per device and MFU, with the ratio.

Each published run (onboard/sizing/plan_published.py: TorchTitan's Llama 3.1 8B on 8 x H100, eager,
compiled and float8; the seed's Qwen3 8B and Qwen3-235B-A22B on 1,024 TPU chips) is re-created on
meta, nothing allocated: the model's flavor, the target from the plan's device table, the published
layout and batch where given, else the plan's own choice. The ratio is predicted / published (of
tokens/s per device where the run published it, else of MFU). Four rows set the time model's
constants (`calibrates`); the held-out row tests what no constant was fitted to. Prints JSON: the
rows, the device table with its sources, the constants in use, and (--derive) the constants
recomputed from the rows. A few seconds on a CPU; no timing protocol: nothing here is measured.

    python bench/plan_vs_published.py [--derive]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from onboard.sizing.hardware import table_rows  # noqa: E402
from onboard.sizing.plan_published import PUBLISHED, constants_in_use, derive_constants, predicted  # noqa: E402
from onboard.sizing.plan_search import CLOSE  # noqa: E402

BAND = (0.7, 1.3)
"""The band every predicted / published ratio should fall in (issue 37)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--derive", action="store_true", help="also recompute the constants from the rows (~10 s)")
    opts = ap.parse_args()
    start = time.perf_counter()
    rows = []
    for row in PUBLISHED:
        print(f"predicting {row.id} ...", file=sys.stderr)
        rows.append(predicted(row))
    errors = [abs(r["ratio"] - 1) for r in rows]
    report = {
        "bench": "plan_vs_published",
        "band": list(BAND),
        "all_within_band": all(BAND[0] <= r["ratio"] <= BAND[1] for r in rows),
        "largest_error": max(errors),
        "choice_margin": CLOSE,
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
