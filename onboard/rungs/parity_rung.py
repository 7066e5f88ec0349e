"""Rung 2, `parity`: the native port computes what upstream HF transformers computes.

The rung renders and computes nothing itself: it runs the workspace's own test_parity.py
with pytest in a subprocess (the same command a person or an agent runs by hand), points
it at the attempt folder for its results JSON, and hands the measurements back to the
engine, which evaluates checklists/parity.yaml. That the test and the gate read the same
checklist is what makes a by-hand pytest fail exactly when the gate fails.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from onboard.errors import BadInput
from onboard.parity.results import RESULTS_ENV, WEIGHTS_ENV, failure_summary, read_results
from onboard.rungs import harness
from onboard.rungs.contract import RungContext, RungResult
from titan_core.runtime.die_with_parent import with_parent_death_signal

RUNG = "parity"


def reads_recipe_key(key: str) -> bool:
    """Parity's native model comes from [model] alone (onboard.parity.native.read_workspace)."""
    return key.startswith("model.")

TEST_FILE = "test_parity.py"


def pytest_command(test_file: Path) -> list[str]:
    """The argv that runs one workspace's test_parity.py, isolated from the folders around it."""
    # --rootdir/--confcutdir keep pytest from picking up ini files and conftests of the
    # folders around the workspace; no cache dir is written into the workspace.
    root = test_file.parent
    return [
        sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
        f"--rootdir={root}", f"--confcutdir={root}",
    ]  # fmt: skip


def _files_read(ws) -> list[Path]:
    files = [ws.recipe_path, ws.adapter_path, ws.root / TEST_FILE]
    files += [p for p in (ws.hf_config_path, ws.twin_path, ws.model_file) if p is not None] + ws.weight_files()
    return [p for p in files if p.is_file()]


def run(ctx: RungContext) -> RungResult:
    """Run the workspace's test_parity.py in a subprocess and return what it measured."""
    ws = ctx.workspace
    test_file = ws.root / TEST_FILE
    if not test_file.is_file():
        raise BadInput(
            f"{test_file} is missing; re-create the workspace with `onboard new-model {ws.name} ... --force`"
        )
    out = ctx.attempt_dir / "results.json"
    out.unlink(missing_ok=True)  # never read an earlier attempt's numbers
    env = {**os.environ, RESULTS_ENV: str(out), "HF_HUB_OFFLINE": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    if ws.weights_dir is not None:
        env[WEIGHTS_ENV] = str(ws.weights_dir)
    cmd = pytest_command(test_file)
    ctx.log(f"parity: {shlex.join(cmd[1:4])} (upstream HF vs native, CPU fp32); results -> {out}")
    log_path = ctx.attempt_dir / "pytest.log"
    with open(log_path, "w") as log:
        try:
            timeout = harness.param(RUNG, "timeout_s")
            # killed with next-step: a kill -9 must not leave it writing into a closed attempt
            proc = subprocess.run(
                with_parent_death_signal(cmd), cwd=ws.root, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    command = f"python -m pytest {test_file} -q"
    if not out.is_file():
        # the test never got to write results (collection error, crash, timeout): every
        # criterion then fails as unmeasured; the log says why
        tail = log_path.read_text()[-2000:]
        return RungResult(
            measurements={"pytest_passed": False, "pytest_exit_code": returncode},
            files_read=_files_read(ws),
            command=command,
            details={"error": "test_parity.py wrote no results", "pytest_log": str(log_path), "pytest_tail": tail},
        )
    results = read_results(out)
    if (results.get("error") or {}).get("kind") == "bad_input":
        raise BadInput(f"parity: {results['error']['message']}")
    measurements = {**results["measurements"], "pytest_passed": returncode == 0, "pytest_exit_code": returncode}
    summary = failure_summary(results)
    if summary and returncode != 0:
        ctx.log(summary)
    keep = ("state_dict", "grads", "error", "weights", "upstream_class", "model_type", "versions", "unconsumed_hf_keys",
            "features", "weights_check", "passes", "model", "weights_note")  # fmt: skip
    details = {k: results.get(k) for k in keep}
    # the per-module table can run to thousands of rows: it stays in results.json
    details["localisation"] = {k: v for k, v in (results.get("localisation") or {}).items() if k != "table"}
    details.update(results_file=str(out), pytest_log=str(log_path), summary=summary)
    return RungResult(measurements=measurements, files_read=_files_read(ws), command=command, details=details)
