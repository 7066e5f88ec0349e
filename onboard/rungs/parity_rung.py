"""Rung 2, `parity`: the native port computes what upstream HF transformers computes.

The rung renders and computes nothing itself: it runs the workspace's own test_parity.py
with pytest in a subprocess (the same command a person or an agent runs by hand), points
it at the attempt folder for its results JSON, and hands the measurements back to the
engine, which evaluates checklists/parity.yaml. That the test and the gate read the same
checklist is what makes a by-hand pytest fail exactly when the gate fails.

Because the gate believes what the test writes, the test must be the one new-model generated:
an edited test_parity.py fails the attempt before it runs (onboard/ladder/template_check.py),
`onboard status` shows a passed entry invalid once the file is edited (`evidence_problem`),
and the results count only if this run's test wrote them into this attempt's folder.

Its gate is checklists/parity.yaml; what it measures is ParityMeasurements
(onboard/ladder/measurements/parity_measurements.py), built once from the results file the test wrote
(`ParityMeasurements.of`: a name the test wrote that the record does not declare fails there) and
how pytest ended.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from onboard.environment import child_env, inherited
from onboard.errors import BadInput
from onboard.parity.results import RESULTS_ENV, WEIGHTS_ENV, failure_summary, read_results, written_by_this_run
from onboard.ladder.template_check import TEST_FILE, tamper_problem
from onboard.rungs import gate_recipe
from onboard.ladder.measurements.parity_measurements import ParityMeasurements
from onboard.ladder.contract import RungContext, RungResult
from titan_core.config.loader import ConfigError
from titan_core.models.registry import get_family
from titan_core.runtime.die_with_parent import with_parent_death_signal

RUNG = "parity"


def pytest_command(test_file: Path) -> list[str]:
    """The argv that runs one workspace's test_parity.py, isolated from the folders around it."""
    # --rootdir/--confcutdir keep pytest from picking up ini files and conftests of the
    # folders around the workspace; no cache dir is written into the workspace. No conftest.py
    # and no ini file at all (-c an empty file): one beside the test could change what it measures.
    root = test_file.parent
    return [
        sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider",
        f"--rootdir={root}", f"--confcutdir={root}", "--noconftest", "-c", os.devnull,
    ]  # fmt: skip


PYTEST_STEERING = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
"""Environment variables through which a shell would change what the parity test runs."""


def _files_read(ws) -> list[Path]:
    files = [ws.recipe_path, ws.adapter_path, ws.root / TEST_FILE]
    files += [p for p in (ws.hf_config_path, ws.twin_path, ws.model_file) if p is not None] + ws.weight_files()
    return [p for p in files if p.is_file()]


def _child_environment(ctx: RungContext, out: Path) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(the test's environment, what the evidence records of it: {passed, ignored}).

    The test reads two ONBOARD_* variables (onboard/environment.py); the rung passes both from the
    workspace alone: its results file, and the weights new-model recorded. Whatever ONBOARD_* the
    command inherited (a by-hand run's ONBOARD_PARITY_WEIGHTS left in the shell) is left out and
    recorded as ignored, so the gate compares what the workspace says and says what it did not use."""
    ws = ctx.workspace
    passed = {RESULTS_ENV: str(out)}
    if ws.weights_dir is not None:
        passed[WEIGHTS_ENV] = str(ws.weights_dir)
    ignored = {k: v for k, v in inherited().items() if passed.get(k) != v}
    for name, value in ignored.items():
        if name != RESULTS_ENV:  # the rung always sets that one: an inherited value is nobody's choice
            ctx.log(f"parity: {name}={value} in the environment is not passed to {TEST_FILE}: the gate runs "
                    f"the workspace's own ({name}={passed[name] if name in passed else ' unset'})")  # fmt: skip
    env = child_env(passed, HF_HUB_OFFLINE="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    for name in PYTEST_STEERING:  # pytest's own variables could add options or plugins to the gate's run
        if env.pop(name, None) is not None:
            ignored[name] = os.environ[name]
    return env, {"passed": passed, "ignored": ignored}


def run(ctx: RungContext) -> RungResult:
    """Run the workspace's test_parity.py in a subprocess and return what it measured."""
    ws = ctx.workspace
    test_file = ws.root / TEST_FILE
    if not test_file.is_file():
        raise BadInput(
            f"{test_file} is missing; re-create the workspace with `onboard new-model {ws.name} ... --force`"
        )
    command = f"python -m pytest {test_file} -q"

    def result(m: ParityMeasurements, details: dict) -> RungResult:
        return RungResult(measurements=m, files_read=_files_read(ws), command=command, details=details)

    try:
        tampered = tamper_problem(ws)
    except ConfigError as e:  # config.json names the model the template is rendered for
        raise BadInput(str(e)) from None
    if tampered:
        ctx.log(f"parity: {tampered}")
        return result(ParityMeasurements(pytest_passed=False), {"error": tampered})
    out = ctx.attempt_dir / "results.json"
    out.unlink(missing_ok=True)  # never read an earlier attempt's numbers
    env, environment = _child_environment(ctx, out)
    cmd = pytest_command(test_file)
    upstream = get_family(ws.family).kind.upstream
    ctx.log(f"parity: {shlex.join(cmd[1:4])} (upstream {upstream} vs native, CPU fp32); results -> {out}")
    log_path = ctx.attempt_dir / "pytest.log"
    started = time.time()
    with open(log_path, "w") as log:
        try:
            timeout = gate_recipe.param(RUNG, "timeout_s")
            # killed with next-step: a kill -9 must not leave it writing into a closed attempt
            proc = subprocess.run(
                with_parent_death_signal(cmd),
                cwd=ws.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    if not out.is_file():
        # the test never got to write results (collection error, crash, timeout): every
        # criterion then fails as unmeasured; the log says why
        tail = log_path.read_text()[-2000:]
        return result(ParityMeasurements(pytest_passed=False, pytest_exit_code=returncode),
                      {"error": "test_parity.py wrote no results", "pytest_log": str(log_path), "pytest_tail": tail,
                       "environment": environment})  # fmt: skip
    if foreign := written_by_this_run(out, ctx.attempt_dir, started):
        return result(ParityMeasurements(pytest_passed=False, pytest_exit_code=returncode),
                      {"error": foreign, "pytest_log": str(log_path), "environment": environment})
    results = read_results(out)
    if (results.get("error") or {}).get("kind") == "bad_input":
        raise BadInput(f"parity: {results['error']['message']}")
    measurements = ParityMeasurements.of(results["measurements"], pytest_passed=returncode == 0,
                                         pytest_exit_code=returncode)  # fmt: skip
    summary = failure_summary(results)
    if summary and returncode != 0:
        ctx.log(summary)
    keep = ("state_dict", "grads", "error", "weights", "upstream_class", "model_type", "versions", "unconsumed_hf_keys",
            "features", "weights_check", "passes", "model", "weights_note", "lora")  # fmt: skip
    details = {k: results.get(k) for k in keep}
    # the per-module table can run to thousands of rows: it stays in results.json
    details["localisation"] = {k: v for k, v in (results.get("localisation") or {}).items() if k != "table"}
    details.update(results_file=str(out), pytest_log=str(log_path), summary=summary, environment=environment)
    return result(measurements, details)
