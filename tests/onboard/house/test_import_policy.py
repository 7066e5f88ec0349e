"""The import policy (docs/LAYOUT.md, "Imports"): the CLI loads no torch before it must.

1. The commands that only read or print (status, list, recipe, waive, report of a workspace
   without runs, skill, --help) finish without importing torch, transformers or matplotlib.
2. The command modules (onboard/cli/app.py, handover.py) import what a command runs inside
   the command: typer builds the whole app on every call, so a module-level import there is
   paid by `onboard --help`.
3. Everywhere else an import sits at module level, unless its line (or the line above it)
   says why not with `# lazy: <reason>`. titan_core too, where no module is exempt: its reasons
   are an optional extra (transformers, datasets, jax, tokamax, torchao, tensorboard, torch_tpu) or a
   heavy module an entry point or a pure-data module avoids, never a cycle (test_layers.py
   CORE_LAYERS forbids those, function-level imports counted).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.workspace.scaffold import plan_workspace, write_workspace

ONBOARD = Path(__file__).resolve().parents[3] / "onboard"
TITAN_CORE = ONBOARD.parent / "titan_core"
COMMAND_MODULES = {ONBOARD / "cli" / "app.py", ONBOARD / "cli" / "handover.py"}
HEAVY = ("torch", "transformers", "matplotlib", "jax")

_PROBE = """
import json, sys
from typer.testing import CliRunner
from onboard.cli.app import app
runner, seen = CliRunner(), {}
for args in json.loads(sys.argv[1]):
    result = runner.invoke(app, args)
    seen[" ".join(args)] = {"exit": result.exit_code, "heavy": sorted(m for m in HEAVY if m in sys.modules)}
print(json.dumps(seen))
"""


def _function_level_imports(path: Path) -> list[tuple[int, int]]:
    """(first line, last line) of every import statement inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= {(s.lineno, s.end_lineno) for s in ast.walk(node) if isinstance(s, (ast.Import, ast.ImportFrom))}
    return sorted(found)


def _has_reason(lines: list[str], first: int, last: int) -> bool:
    """`# lazy:` on one of the statement's lines or on the line above it."""
    return any("# lazy:" in text for text in lines[max(first - 2, 0) : last])


@pytest.mark.parametrize("package", [ONBOARD, TITAN_CORE], ids=lambda p: p.name)
def test_every_function_level_import_outside_the_command_modules_says_why(package):
    missing = []
    for path in sorted(package.rglob("*.py")):
        if path in COMMAND_MODULES:
            continue
        lines = path.read_text().split("\n")
        for first, last in _function_level_imports(path):
            if not _has_reason(lines, first, last):
                missing.append(f"{path.relative_to(ONBOARD.parent)}:{first}: {lines[first - 1].strip()}")
            elif package == TITAN_CORE and "cycle" in " ".join(lines[max(first - 2, 0) : last]):
                # titan_core's layers admit no cycle at all, so dodging one is no reason: break it
                missing.append(f"{path.relative_to(ONBOARD.parent)}:{first}: a cycle named as the reason")
    assert not missing, "function-level imports without '# lazy: <reason>' (move them up or say why):\n" + "\n".join(
        missing
    )


def test_the_reason_check_catches_a_bare_lazy_import(tmp_path):
    bare = tmp_path / "m.py"
    bare.write_text("def f():\n    import torch\n    return torch\n")
    reasoned = tmp_path / "n.py"
    reasoned.write_text("def f():\n    import torch  # lazy: the CLI starts without torch\n    return torch\n")
    verdicts = [
        _has_reason(p.read_text().split("\n"), *span) for p in (bare, reasoned) for span in _function_level_imports(p)
    ]
    assert verdicts == [False, True]


def test_reading_commands_load_no_torch(tmp_path):
    plan = plan_workspace("m", tmp_path, preset="llama3/debugmodel", device="cpu")
    write_workspace(plan)
    d = str(tmp_path)
    commands = [
        ["--help"],
        ["status", "m", "--dir", d],
        ["list", "--dir", d],
        ["recipe", "m", "--dir", d],
        ["report", "m", "--dir", d],
        ["waive", "--help"],
        ["skill", "--help"],
    ]
    probe = f"HEAVY = {HEAVY!r}\n" + _PROBE
    out = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(commands)], capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(out.stdout)
    assert {cmd: r["exit"] for cmd, r in seen.items()} == {" ".join(c): 0 for c in commands}
    assert {cmd: r["heavy"] for cmd, r in seen.items() if r["heavy"]} == {}
