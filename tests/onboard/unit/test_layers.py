"""onboard's folders are layers: every import points down the one declared order, and `onboard status`
of a finished ladder loads neither torch nor any rung's module.

LAYERS is the order (top first), in this one place; docs/DESIGN.md gives a reason per boundary. A
module's layer is its sub-package (onboard/<layer>/...) or, for a top-level module, its own name.
The import graph is read from the source (tests/onboard/unit/test_structure.py: every import,
function-level and TYPE_CHECKING ones included), so a lazy import pointing up fails here too.
titan_core is below every layer and never imports onboard (test_structure.py holds that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from test_report_files import demo_ws  # noqa: F401  (a finished ladder: the demo's ledger entries and run records)
from test_structure import ROOT, cycles, import_graph

from attempt_folders import write_attempt_folder
from onboard.workspace.ledger import parse_iso

LAYERS = (
    "__main__",  # python -m onboard
    "cli",  # the commands
    "compat",  # onboard compat: climbs transformers architectures through the engine
    "engine",  # next-step: the one place that imports and runs a rung
    "sizing",  # the plan and the fit: ask the rungs' helpers what a run would do
    "rungs",  # each rung's run(ctx) and the helpers they share
    "report",  # REPORT.md from the ledger and the run folders
    "parity",  # test_parity.py's comparisons, native against upstream
    "ladder",  # the light half: rung table, declarations, states, gates, evidence
    "workspace",  # one model's folder: its files, ladder.json (the ledger), the lock, the scaffold
    "upstream",  # transformers' own model for a config, its init and checkpoint headers
    "environment",  # the ONBOARD_* variables
    "sanitize",  # strings for the terminal, rich markup and HTML
    "errors",  # BadInput, Interrupted, the exit codes
)
"""onboard's layers, top first: a module may import its own layer and those below it, never one above."""


def layer_of(module: str) -> str | None:
    """The layer of an onboard module (None: the `onboard` package itself, or not onboard)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "onboard" and len(parts) > 1 else None


def layer_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """{layer: {imported layer: ["module -> module", ...]}} of the imports between onboard's layers."""
    out: dict[str, dict[str, list[str]]] = {}
    for module, imported in graph.items():
        here = layer_of(module)
        for other in imported:
            there = layer_of(other)
            if here and there and here != there:
                out.setdefault(here, {}).setdefault(there, []).append(f"{module} -> {other}")
    return out


def upward(layers: dict[str, dict[str, list[str]]], order=LAYERS) -> list[str]:
    """Each import that points up the order (or touches an undeclared layer), one line each."""
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for here, targets in sorted(layers.items()):
        for there, edges in sorted(targets.items()):
            if here not in rank or there not in rank:
                bad += [f"{e} (layer {here if here not in rank else there} is not in LAYERS)" for e in sorted(edges)]
            elif rank[there] < rank[here]:
                bad += [f"{e} ({here} imports {there}, above it)" for e in sorted(edges)]
    return bad


def test_the_checker_finds_an_upward_import_and_a_cycle():
    graph = {"onboard.ladder.a": {"onboard.rungs.b"}, "onboard.rungs.b": {"onboard.ladder.a"}}
    layers = layer_graph(graph)
    assert upward(layers) == ["onboard.ladder.a -> onboard.rungs.b (ladder imports rungs, above it)"]
    assert cycles({h: set(t) for h, t in layers.items()}) == [["ladder", "rungs"]]  # both import the other
    undeclared = upward(layer_graph({"onboard.nowhere.a": {"onboard.errors"}}))
    assert undeclared[0].endswith("(layer nowhere is not in LAYERS)")


def test_every_onboard_layer_is_declared_once():
    assert len(set(LAYERS)) == len(LAYERS)
    present = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "onboard").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}  # fmt: skip
    assert present == set(LAYERS)


def test_imports_point_down_the_layers_and_no_layers_form_a_cycle():
    layers = layer_graph(import_graph())
    bad = upward(layers)
    assert not bad, "imports pointing up onboard's layers (tests/onboard/unit/test_layers.py LAYERS):\n" + "\n".join(
        f"  {line}" for line in bad
    )
    found = cycles({name: set(layers.get(name, {})) for name in set(layers) | {t for v in layers.values() for t in v}})
    assert not found, f"cycles between onboard's layers: {found}"


@pytest.fixture
def complete_ws(demo_ws):  # noqa: F811
    """The demo's ledger with its last rung too: tuning's entry from a real `onboard demo` climb
    (tuning_entry.json; it kept no change, so the recipe stays), dated after the kernels rung and
    given its attempt folder (record, metrics) and this workspace's file hashes, as the engine writes them."""
    ws = demo_ws
    data = json.loads(ws.ledger.path.read_text())
    entry = json.loads((Path(__file__).parent / "tuning_entry.json").read_text())
    last = max(parse_iso(e["ended"]) for e in data["attempts"])
    entry["started"] = (last + timedelta(seconds=1)).isoformat()
    entry["ended"] = (last + timedelta(seconds=49)).isoformat()
    entry["attempt_dir"] = "runs/tuning/attempt-1"
    entry["files_read"] = ws.hashes(list(entry["files_read"]))
    data["attempts"].append(write_attempt_folder(ws, entry))  # its record and its runs' metrics files
    ws.ledger.path.write_text(json.dumps(data, indent=1))
    return ws


def test_status_of_a_climbed_ladder_loads_no_torch_and_no_rung(complete_ws):
    """`onboard status --json` of a complete ladder, in a fresh process: the ladder's light half only."""
    ws = complete_ws
    probe = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from onboard.cli.app import app\n"
        f"r = CliRunner().invoke(app, ['status', {ws.name!r}, '--dir', {str(ws.root.parent.parent)!r}, '--json'])\n"
        "from onboard.ladder.table import TABLE\n"
        "runners = {r.runner for r in TABLE.values()}\n"
        "mods = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m in runners)\n"
        "print(__import__('json').dumps({'exit': r.exit_code, 'out': r.stdout, 'loaded': mods}))\n"
    )
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    status = json.loads(result["out"])
    # every rung passed, each re-checked as evidence (parity's test file re-rendered from its
    # template, each run record read back), none stale or invalid
    assert result["exit"] == 0 and status["current_rung"] is None, result["out"]
    assert [r["status"] for r in status["rungs"]] == ["passed"] * 7
    assert result["loaded"] == []


def test_the_template_checks_diffusion_families_are_titan_cores():
    """template_check reads them from the config reader (no torch); they are the registry's."""
    from onboard.ladder.template_check import DIFFUSION_FAMILIES
    from titan_core.models.registry import DIFFUSION_FAMILIES as REGISTRY

    assert DIFFUSION_FAMILIES == frozenset(REGISTRY) != frozenset()
