"""A measurement is recorded as the float it is. ladder.json (onboard/workspace/ledger.py) and the attempt
folder's measurements.json (onboard/ladder/measurements/run_metrics.py) write floats through json.dumps,
which spells a float by its repr, so every float reads back bit for bit and no `*_repr` string copy is
needed. An older ledger's copies still load, and are never shown (onboard/ladder/measurements/retired.py).
"""

from __future__ import annotations

import json
import struct

from onboard.ladder.measurements.retired import REPR_COPIES, RETIRED, shown_measurements
from onboard.ladder.measurements.run_metrics import attempt_record_text
from onboard.ladder.measurements.training_measurements import EagerMeasurements
from onboard.ladder.table import RUNGS, TABLE
from onboard.workspace.ledger import Entry, Ledger, Status, run_record_text

AWKWARD = [1e-17, 0.1 + 0.2, 5e-324, 1.7976931348623157e308, -0.0]
"""Far below 1, not a short decimal, the smallest subnormal, the largest double, and a signed zero."""
STARTED, ENDED = "2025-01-01T00:00:00.000000+00:00", "2025-01-01T00:01:00.000000+00:00"


def bits(value) -> object:
    """Floats (in lists and dicts too) as their 8 bytes: -0.0 is not 0.0 here, as it is under ==."""
    if isinstance(value, float):
        return struct.pack("<d", value)
    if isinstance(value, dict):
        return {k: bits(v) for k, v in value.items()}
    if isinstance(value, list):
        return [bits(v) for v in value]
    return value


def awkward_entry() -> Entry:
    """A passed eager attempt whose measurements hold each awkward float, alone and in a list."""
    m = EagerMeasurements(precision="fp32", step1_loss=AWKWARD[1], step1_grad_norm=AWKWARD[0], last_loss=AWKWARD[2],
                          ln_vocab=AWKWARD[3], bf16_rounding=AWKWARD[4], step_times_s=list(AWKWARD))  # fmt: skip
    return Entry(rung="eager", attempt=1, status=Status.PASSED, started=STARTED, ended=ENDED,
                 measurements=m.as_metrics())  # fmt: skip


def test_awkward_floats_survive_ladder_json_exactly(tmp_path):
    entry = awkward_entry()
    ledger = Ledger.new(tmp_path / "ladder.json", {"name": "floats"})
    ledger.append(entry)
    ledger.save()
    back = Ledger.load(tmp_path / "ladder.json").entries("eager")[0].measurements
    assert bits(back) == bits(entry.measurements)
    assert back["step_times_s"] == AWKWARD and str(back["bf16_rounding"]) == "-0.0"


def test_awkward_floats_survive_the_attempt_folders_record_exactly():
    entry = awkward_entry()
    for text in (run_record_text(entry), attempt_record_text(entry, [])):
        assert bits(json.loads(text)["measurements"]) == bits(entry.measurements)


def test_no_rung_declares_a_retired_measurement():
    for rung in RUNGS:
        assert not RETIRED & TABLE[rung].measurements.declared(), rung
    assert all(name.endswith("_repr") for name in REPR_COPIES)


def test_an_older_ledgers_repr_copies_load_and_are_never_shown(tmp_path):
    old = awkward_entry().to_dict()
    old["measurements"] |= {name: "7.5" for name in REPR_COPIES}  # as an earlier onboard wrote them
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps({"format": 1, "workspace": {}, "attempts": [old], "waivers": []}))
    m = Ledger.load(path).entries("eager")[0].measurements
    shown = shown_measurements(m)
    assert not REPR_COPIES & set(shown) and bits(shown) == bits(awkward_entry().measurements)
