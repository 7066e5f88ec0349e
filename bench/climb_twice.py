"""Do the ladder's decisions hold? One config climbed in two fresh workspaces, side by side.

Each workspace is scaffolded the same way (`onboard new-model`) and climbed with `next_step`
until the ladder is complete or a step does not pass; the calls are counted (a climb that
flips levers between rungs never ends, so the count is bounded by twice the rungs). The two
final recipes are then compared key by key. A key that differs is *explained* when either
workspace's latest decision about it (`details.decisions` of its ledger) says the two values
were indistinguishable or not measured: the ledger then says why the climbs may differ. An
unexplained difference means one climb took a decision the other's evidence contradicts.

Prints one JSON document: per workspace its calls, final levers and seconds; the differing
keys, each with the decisions that explain it (or none); and the verdict.

    python bench/climb_twice.py --hf-config phi3_tiny.json --path transformers --dir /tmp/twice
    python bench/climb_twice.py --preset llama3/debugmodel --dir /tmp/twice [--timing quick]

`summarize` and `compare` also judge two workspaces climbed some other way (the suite judges two
climbs decided on recorded step times: tests/onboard/e2e/test_decisions_twice.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from typer.testing import CliRunner  # noqa: E402

from onboard.cli.app import app  # noqa: E402
from onboard.ladder.states import current_state, ladder_states
from onboard.ladder.table import default_specs
from onboard.engine.next_step import next_step  # noqa: E402
from onboard.ladder import contract
from onboard.rungs import timing_profiles# noqa: E402
from onboard.ladder.decision import INDISTINGUISHABLE, NOT_MEASURED  # noqa: E402
from onboard.workspace.layout import Workspace  # noqa: E402

ACCEPTED = ("passed", "not_applicable")
LEVERS = ("training.mixed_precision_param", "compile.enable", "graph_trainer.enable", "kernels", "training.batch_size",
          "training.grad_accum", "device.threads", "graph_trainer")  # fmt: skip
"""Recipe keys (or sections) the rungs decide; the rest of the recipe is new-model's and the same in both."""


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def levers(recipe_path: Path) -> dict:
    values = flat(tomllib.loads(recipe_path.read_text()))
    return {k: v for k, v in values.items() if any(k == lever or k.startswith(lever + ".") for lever in LEVERS)}


def climb(base: Path, name: str, scaffold: list[str], log, timing: str) -> dict:
    result = CliRunner().invoke(app, ["new-model", name, "--dir", str(base), *scaffold])
    if result.exit_code != 0:
        raise SystemExit(f"new-model failed ({result.exit_code}): {result.output}")
    specs = default_specs()
    budget = 3 * len([s for s in specs if s.built])
    calls, t0, last = [], time.monotonic(), None
    for _ in range(budget):
        last = next_step(Workspace.load(base, name), specs=specs, timing_profile=timing)
        calls.append({"rung": last.rung, "status": str(last.status)})
        log(f"{name}: call {len(calls)}: {last.rung} {last.status}")
        if str(last.status) not in ACCEPTED:
            break
    side = summarize(Workspace.load(base, name))
    return {**side, "calls": len(calls), "steps": calls, "final_status": str(last.status),
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


def summarize(ws: Workspace) -> dict:
    """A climbed workspace: its rung attempts (ledger entries), whether the ladder is complete,
    the levers its recipe ended with and the latest decision about each lever."""
    specs = default_specs()
    decisions = {}
    for entry in ws.ledger.attempts:
        for d in (entry.details or {}).get("decisions") or []:
            if isinstance(d, dict) and "lever" in d:
                decisions[d["lever"]] = d  # the latest decision about each lever
    complete = current_state(ladder_states(ws, specs)) is None
    return {"workspace": str(ws.root), "attempts": len(ws.ledger.attempts), "complete": complete,
            "levers": levers(ws.recipe_path), "decisions": decisions}  # fmt: skip


def explained(key: str, sides: list[dict]) -> list[dict]:
    """The decisions, on either side, that say the two values of `key` were not told apart."""
    out = []
    for side in sides:
        for lever, d in side["decisions"].items():
            covers = key == lever or (lever == "execution_mode" and key in ("compile.enable", "graph_trainer.enable"))
            if covers and d.get("verdict") in (INDISTINGUISHABLE, NOT_MEASURED):
                out.append({"workspace": side["workspace"], "lever": lever, "verdict": d["verdict"], "why": d.get("why")})
    return out


def compare(sides: list[dict]) -> dict:
    """Two `summarize`d workspaces side by side: the lever keys that differ, each with the decisions
    that explain it; whether every difference is explained and each climb took at most twice the
    built rungs in attempts and ended complete."""
    keys = sorted(set(sides[0]["levers"]) | set(sides[1]["levers"]))
    differ = [{"key": k, "values": [s["levers"].get(k) for s in sides], "explained_by": explained(k, sides)}
              for k in keys if sides[0]["levers"].get(k) != sides[1]["levers"].get(k)]  # fmt: skip
    bound = 2 * len([s for s in default_specs() if s.built])
    return {
        "call_bound": bound,
        "sides": sides,
        "differ": differ,
        "same_levers": not differ,
        "every_difference_explained": all(d["explained_by"] for d in differ),
        "within_call_bound": all(s["attempts"] <= bound and s["complete"] for s in sides),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf-config", type=Path)
    src.add_argument("--preset")
    ap.add_argument("--path", default="native", help="native | port | transformers")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dir", type=Path, required=True, help="an empty folder for the two workspaces")
    ap.add_argument("--timing", default=contract.SHIPPED, choices=sorted(timing_profiles.TIMING_PROFILES))
    a = ap.parse_args(argv)
    if a.dir.exists() and any(a.dir.iterdir()):
        print(f"error: {a.dir} is not empty (the two workspaces must be fresh)", file=sys.stderr)
        return 2
    a.dir.mkdir(parents=True, exist_ok=True)
    scaffold = ["--hf-config", str(a.hf_config)] if a.hf_config else ["--preset", a.preset]
    scaffold += ["--path", a.path, "--device", a.device]
    sides = []
    for name in ("first", "second"):
        sides.append(climb(a.dir, name, scaffold, lambda line: print(line, file=sys.stderr, flush=True), a.timing))
    report = {"timing_profile": a.timing, **compare(sides)}
    print(json.dumps(report, indent=1, default=str))
    return 0 if report["every_difference_explained"] and report["within_call_bound"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
