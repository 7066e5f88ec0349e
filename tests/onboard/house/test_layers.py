"""onboard's folders are layers, and so are titan_core's: every import points down the one declared order
of its package, and `onboard status` of a finished ladder loads neither torch nor any rung's module.

LAYERS (onboard) and CORE_LAYERS (titan_core) are the orders (top first), in this one place;
docs/DESIGN.md gives a reason per boundary. A module's layer is its sub-package (<package>/<layer>/...)
or, for a top-level module, its own name. The import graph is read from the source
(tests/onboard/house/test_structure.py: every import, function-level and TYPE_CHECKING ones included),
so a lazy import pointing up fails here too. titan_core is below every layer of onboard and never
imports onboard (test_structure.py holds that).
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

CORE_LAYERS = (
    "train",  # python -m titan_core.train: one process, or --nproc N through the launcher
    "launch",  # python -m titan_core.launch: torchrun's own launcher, the recipe checked first
    "launcher",  # N local processes through torchrun: checks a recipe as a run would, reads its metrics
    "training",  # the Trainer, the step, optimizer, checkpoints, HF load and export, validation
    "lora",  # [lora]: peft's adapters on a built model, named by HF module names; the PEFT export
    "compile",  # per-block torch.compile and the Graph Trainer: the step the training layer runs
    "parallel",  # mesh, SimpleFSDP / FSDP2, tp, cp, ep, pp, the token-mean loss over ranks
    "kernels",  # swaps that replace a model's modules: attention, MoE, fused loss, float8
    "weights",  # HF safetensors headers, read and checked against a model without loading it
    "memory",  # the memory model, the device budget, the preflight refusal, measured peaks
    "models",  # the families, the model protocol, the module-swap registry, a recipe's model built
    "data",  # rows and batches: synthetic, text and dataset sources, tokenizers, packing, the loader
    "measure",  # metrics, a run's steady window, the timing protocol, profiler windows
    "runtime",  # the process: devices, process groups, collectives, CPU load and peak, files, argv
    "config",  # the config tree, TOML and overrides, HF config.json, ConfigError
)
"""titan_core's layers, top first: the same rule as LAYERS."""

PACKAGES = {"onboard": ("LAYERS", LAYERS), "titan_core": ("CORE_LAYERS", CORE_LAYERS)}
"""Each package's declared order, under the name a message gives it."""


def layer_of(module: str, package: str = "onboard") -> str | None:
    """The layer of a module of `package` (None: the package itself, or another package's module)."""
    parts = module.split(".")
    return parts[1] if parts[0] == package and len(parts) > 1 else None


def layer_graph(graph: dict[str, set[str]], package: str = "onboard") -> dict[str, dict[str, list[str]]]:
    """{layer: {imported layer: ["module -> module", ...]}} of the imports between `package`'s layers."""
    out: dict[str, dict[str, list[str]]] = {}
    for module, imported in graph.items():
        here = layer_of(module, package)
        for other in imported:
            there = layer_of(other, package)
            if here and there and here != there:
                out.setdefault(here, {}).setdefault(there, []).append(f"{module} -> {other}")
    return out


def upward(layers: dict[str, dict[str, list[str]]], package: str = "onboard") -> list[str]:
    """Each import that points up `package`'s order (or touches an undeclared layer), one line each."""
    name, order = PACKAGES[package]
    rank = {layer: i for i, layer in enumerate(order)}
    bad = []
    for here, targets in sorted(layers.items()):
        for there, edges in sorted(targets.items()):
            if here not in rank or there not in rank:
                bad += [f"{e} (layer {here if here not in rank else there} is not in {name})" for e in sorted(edges)]
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


def test_the_checker_finds_an_upward_import_and_a_cycle_in_titan_core():
    # a lazy import of the trainer from the memory model: up two layers, and a cycle with training's import of memory
    graph = {
        "titan_core.memory.preflight": {"titan_core.training.trainer"},
        "titan_core.training.trainer": {"titan_core.memory.preflight", "onboard.cli.app"},  # onboard is not a layer here
    }
    layers = layer_graph(graph, "titan_core")
    assert upward(layers, "titan_core") == [
        "titan_core.memory.preflight -> titan_core.training.trainer (memory imports training, above it)"
    ]
    assert cycles({h: set(t) for h, t in layers.items()}) == [["memory", "training"]]
    undeclared = upward(layer_graph({"titan_core.nowhere.a": {"titan_core.config.loader"}}, "titan_core"), "titan_core")
    assert undeclared == ["titan_core.nowhere.a -> titan_core.config.loader (layer nowhere is not in CORE_LAYERS)"]
    top_level = upward(layer_graph({"titan_core.runtime.argv": {"titan_core.train"}}, "titan_core"), "titan_core")
    assert top_level == ["titan_core.runtime.argv -> titan_core.train (runtime imports train, above it)"]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_layer_is_declared_once(package):
    name, order = PACKAGES[package]
    assert len(set(order)) == len(order), name
    present = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / package).iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}  # fmt: skip
    assert present == set(order), f"{package}'s folders and top-level modules against {name}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_point_down_the_layers_and_no_layers_form_a_cycle(package):
    layers = layer_graph(import_graph(), package)
    bad = upward(layers, package)
    name = PACKAGES[package][0]
    assert not bad, f"imports pointing up {package}'s layers (tests/onboard/house/test_layers.py {name}):\n" + "\n".join(
        f"  {line}" for line in bad
    )
    found = cycles({layer: set(layers.get(layer, {})) for layer in set(layers) | {t for v in layers.values() for t in v}})
    assert not found, f"cycles between {package}'s layers: {found}"


def test_no_module_imports_a_rung_runner():
    """A rung's runner (the rung table's `runner`: `<rung>_rung.py`, `kernels_rung/rung.py`, `tuning_rung/rung.py`)
    is reached by name only, imported by the engine's next-step (onboard/engine/next_step.py, `runner_of`): no
    module of onboard or titan_core imports one (a helper inside a rung's package may be shared)."""
    from onboard.ladder.table import TABLE

    runners = {r.runner for r in TABLE.values() if r.runner}
    assert runners, "the rung table names no runner"
    importers = sorted(f"{m} -> {r}" for m, imported in import_graph().items() for r in imported & runners)
    assert not importers, "modules importing a rung's runner:\n" + "\n".join(f"  {line}" for line in importers)


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


def test_the_template_check_reads_the_upstream_a_family_declares_from_its_config():
    """template_check takes render.py's `diffusion` flag from config.json through the config reader (no
    torch); every native family's own config gives the upstream its kind declares (ModelKind.upstream)."""
    from titan_core.config.hf_config import config_upstream
    from titan_core.models.registry import NATIVE_FAMILIES, get_family

    families = [get_family(name) for name in NATIVE_FAMILIES]
    assert {f.kind.upstream for f in families} == {"transformers", "diffusers"}
    for f in families:
        assert config_upstream(f.adapter.hf_config(f.flavors["debugmodel"])) == f.kind.upstream, f.name
