"""What every bench shares: the timing protocol's flags, one comparison's JSON entry, the report, and
the main of a bench that runs shape by shape.

Speed goes through titan_core.measure.timing (`compare`: interleaved, with an interval); the report
records the protocol's settings and the machine's 1-minute load at start and end, and
lists every comparison as `Comparison.to_dict()` plus its line (onboard.ladder.gates.comparison_line:
an interval that measured nothing prints "not measured", never 0.00-1343427.45). Progress goes
to stderr, so stdout is the one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from onboard.ladder.gates import comparison_line
from titan_core.measure.timing import Comparison, TimingProtocol


def load() -> float | None:
    """The machine's 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


PROTOCOL_FLAGS = {
    "warmup": "--warmup-rounds",
    "min_rounds": "--min-rounds",
    "max_rounds": "--max-rounds",
    "max_seconds": "--max-seconds",
}
"""The TimingProtocol fields a bench's command line sets, and their flags."""


def add_protocol_args(ap: argparse.ArgumentParser) -> None:
    """--warmup-rounds / --min-rounds / --max-rounds / --max-seconds; unset, TimingProtocol's defaults."""
    d = TimingProtocol()
    g = ap.add_argument_group("timing protocol (titan_core.measure.timing.TimingProtocol; shorten for smoke runs)")
    g.add_argument("--warmup-rounds", type=int, dest="warmup", help=f"rounds discarded first (default {d.warmup})")
    g.add_argument("--min-rounds", type=int, dest="min_rounds", help=f"default {d.min_rounds}, at most --max-rounds")
    g.add_argument("--max-rounds", type=int, dest="max_rounds", help=f"default {d.max_rounds}")
    g.add_argument("--max-seconds", type=float, dest="max_seconds", help=f"per comparison ({d.max_seconds:g})")


def protocol_from(a: argparse.Namespace) -> TimingProtocol:
    """The protocol the command line asked for (TimingProtocol.from_dict: unset flags keep the defaults)."""
    # a bench's figure is its answer: measured until its interval is narrow, not only until it decides
    return TimingProtocol.from_dict({"stop_when_settled": False, **{field: getattr(a, field) for field in PROTOCOL_FLAGS}})


def protocol_args(p: TimingProtocol) -> list[str]:
    """The flags that hand `p` to a bench's own subprocess (read back there by `protocol_from`)."""
    return [f"{flag}={getattr(p, field)!r}" for field, flag in PROTOCOL_FLAGS.items()]


def entry(cmp: Comparison, candidate: str, baseline: str, **context) -> dict:
    """One comparison as the reports list it: what was compared, its line (`comparison_line`), to_dict()."""
    return {**context, "candidate": candidate, "baseline": baseline,
            "describe": comparison_line(cmp, candidate, baseline), **cmp.to_dict()}  # fmt: skip


def speedup_interval(c: dict) -> list[float] | None:
    """[low, high] of an entry's speed-up (baseline time / candidate time); None when its interval
    is not finite (a `not measured` comparison may have none to invert)."""
    lo, hi = c.get("ci_low"), c.get("ci_high")
    if not all(isinstance(v, (int, float)) and 0 < v < float("inf") for v in (lo, hi)):
        return None
    return [1 / hi, 1 / lo]


def start(benchmark: str, protocol: TimingProtocol, **fields) -> dict:
    """A report to fill in: `comparisons` takes `entry(...)`s; `emit` finishes and prints it."""
    return {"benchmark": benchmark, "timing_protocol": protocol.settings(), "load_avg_1m": {"start": load()},
            **fields, "comparisons": []}  # fmt: skip


def by_shape(benchmark: str, doc: str, shapes: str, run_shape, **fields) -> tuple[dict, argparse.Namespace]:
    """The shape-by-shape bench's main: `--shapes` (default `shapes`), `--out` and the timing protocol's
    flags parsed, `run_shape(shape, protocol, work)` run for each shape in one temporary folder, each
    result under `shapes` and its comparisons pooled; (the report, for the bench's verdicts, and the args)."""
    import tempfile

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--out", default="", help="also write the JSON here")
    add_protocol_args(ap)
    a = ap.parse_args()
    protocol = protocol_from(a)
    report = start(benchmark, protocol, **fields, shapes=[])
    with tempfile.TemporaryDirectory(prefix=f"{benchmark}_") as work:
        for shape in a.shapes.split(","):
            res = run_shape(shape, protocol, work)
            report["comparisons"] += res.pop("comparisons")
            report["shapes"].append(res)
    return report, a


def emit(report: dict, out: str = "") -> None:
    """Record the load at the end, print each comparison's line to stderr and the JSON to stdout (and `out`)."""
    report["load_avg_1m"]["end"] = load()
    for c in report["comparisons"]:
        print(c["describe"], file=sys.stderr)
    text = json.dumps(report, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    print(text, flush=True)


def progress(obj) -> None:
    """One line of progress (a dict as JSON) on stderr."""
    print(obj if isinstance(obj, str) else json.dumps(obj), file=sys.stderr, flush=True)


SLICE_8B = ("{n_layers = 2, dim = 4096, n_heads = 32, n_kv_heads = 8, head_dim = 128, ffn_hidden_dim = 14336, "
            "vocab_size = 8192}")  # fmt: skip
"""A 2-layer slice of Llama 3 8B's widths, with an 8192-token vocabulary so that its embedding and head do not
dwarf the two blocks (llama3 model.overrides)."""


def one_process_trainer(overrides: str, seq: int, out: str, *flags: str):
    """A Trainer of llama3 with `overrides` (model.overrides), one process on the CPU, fp32, batch 1 of `seq`
    tokens, its metrics under `out`, `flags` on top: the one-process benches' model."""
    from titan_core.config import load_config  # lazy: a bench sets its environment before torch loads
    from titan_core.training.trainer import Trainer

    cfg = load_config(None, [
        "--model.family=llama3", "--model.flavor=debugmodel", f"--model.overrides={overrides}",
        "--parallelism.data_parallel=none", "--device.type=cpu", "--training.batch_size=1",
        f"--training.seq_len={seq}", f"--metrics.output_dir={out}", *flags,
    ])  # fmt: skip
    return Trainer(cfg, quiet=True)
