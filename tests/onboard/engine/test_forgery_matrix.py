"""Forged evidence in every shape the issue's probes found, against every reader.

Each case starts from an eager attempt the real engine recorded (onboard/engine/attempt.py) for a
fake eager rung that writes its metrics.jsonl the way titan_core does (MetricsLogger) and records
its run as the real rung does (contract.record_run): the attempt folder then holds what a real one
holds (metrics, record with file hashes and runs). The rung is judged by the shipped eager checklist
and read back by the real rung table (`default_specs`), as `status` reads any workspace. Then the
case forges one thing by hand and checks that `status --json`, `recipe` (JSON and text) and `report`
(REPORT.md) each show eager invalid with the reason, while the untouched workspace shows passed.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.engine.next_step import next_step
from onboard.ladder.contract import RungResult, record_run
from onboard.ladder.measurements.training_measurements import EagerMeasurements
from onboard.ladder.table import RUNGS, RungSpec
from onboard.workspace.layout import Workspace
from onboard.workspace.ledger import RUN_RECORD, Ledger
from onboard.workspace.scaffold import plan_workspace, write_workspace
from titan_core.measure.metrics import MetricsLogger

STEPS = 20
LN_VOCAB = math.log(2048)
METRICS = "runs/eager/attempt-1/metrics.jsonl"
RECORD = f"runs/eager/attempt-1/{RUN_RECORD}"


class FakeEager:
    """An eager rung without torch: `losses` as its run's rows (20 planned steps; a NaN stops the run
    there, as titan_core stops), written and recorded as the real rung's run is."""

    RUNG = "eager"
    MEASUREMENTS = EagerMeasurements  # so the engine's own spec re-derives like the real table's

    def __init__(self, losses: list[float]):
        self.losses = losses

    def run(self, ctx):
        logger = MetricsLogger(ctx.attempt_dir, console=False)
        rows = []
        for step, loss in enumerate(self.losses, 1):
            rows.append({"step": step, "loss": loss, "grad_norm": 2.0 / step})
            logger.log(rows[-1])
            if not math.isfinite(loss):
                break
        logger.close()
        record_run(ctx, "eager", rows, STEPS)
        first, last = rows[0], rows[-1]
        finite = len(rows) == STEPS and all(math.isfinite(r["loss"]) for r in rows)
        m = EagerMeasurements(
            steps_run=len(rows), steps_planned=STEPS, all_finite=finite, precision="fp32",
            step1_loss=first["loss"], step1_grad_norm=first["grad_norm"], last_loss=last["loss"],
            vocab_size=2048, ln_vocab=LN_VOCAB, expected_step1_loss=LN_VOCAB, expected_step1_loss_is="ln(vocab 2048)",
            step1_loss_rel_to_expected=abs(first["loss"] - LN_VOCAB) / LN_VOCAB,
            step1_loss_reference="none: the recipe has no checkpoint.initial_hf",
            step1_loss_vs_transformers_rel_err=0.0,
            full_model_built_on_meta=True, full_model_key_mismatches=0, full_model_checkpoint_problems=0,
        )  # fmt: skip
        files = [ctx.workspace.root / f for f in ("recipe.toml", "config.json", "adapter.py")]
        return RungResult(m, files, "fake eager", details={"device": "cpu", "loss_curve": [r["loss"] for r in rows]})


GOOD = [7.6 - 0.2 * i for i in range(STEPS)]
NAN = [math.nan]


def specs(losses):
    """The fake eager rung (the shipped eager checklist judges it); the other rungs not built."""
    return [RungSpec(r, None, module=FakeEager(losses)) if r == "eager" else RungSpec(r, None) for r in RUNGS]


CLIMBED: dict = {}
"""(name, losses, edit_config) -> the workspace climbed so, once per module (see `climb`)."""


@pytest.fixture(autouse=True, scope="module")
def climbed_once(tmp_path_factory):
    CLIMBED["base"] = tmp_path_factory.mktemp("climbed")
    yield
    CLIMBED.clear()


def climb(tmp_path, name: str, losses, *, edit_config: bool = False) -> Workspace:
    """Workspace NAME under `tmp_path` after the fake eager rung ran `losses`. Each (name, losses, config)
    is scaffolded and climbed once per module in a folder of its own, and a test gets a copy of that
    workspace folder (it holds no absolute path): the forgeries edit their own copy."""
    key = (name, tuple(map(repr, losses)), edit_config)
    if key not in CLIMBED:
        base = CLIMBED["base"] / str(len(CLIMBED))
        write_workspace(plan_workspace(name, base, preset="llama3/debugmodel", device="cpu"))
        ws = Workspace.load(base, name)
        if edit_config:  # another model: its config.json differs
            (ws.root / "config.json").write_text((ws.root / "config.json").read_text() + "\n")
        next_step(ws, specs=specs(losses))
        CLIMBED[key] = ws.root
    shutil.copytree(CLIMBED[key], tmp_path / "onboarding" / name)
    return Workspace.load(tmp_path, name)


def edit_json(path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def edit_entry(ws: Workspace, edit) -> None:
    """Apply `edit(entry)` to the eager entry of ladder.json on disk, as a hand edit would."""
    edit_json(ws.root / "ladder.json", lambda d: edit(d["attempts"][0]))


def edit_metrics(ws: Workspace, edit) -> None:
    path = ws.root / METRICS
    lines = path.read_text().splitlines()
    path.write_text("".join(line + "\n" for line in edit(lines)))


def set_step(lines: list[str], step: int, **values) -> list[str]:
    row = json.loads(lines[step - 1])
    row.update(values)
    return lines[: step - 1] + [json.dumps(row)] + lines[step:]


# ---- the forgeries ------------------------------------------------------------------------------
def loss_edited(tmp_path):
    ws = climb(tmp_path, "m", GOOD)
    edit_metrics(ws, lambda lines: set_step(lines, 7, loss=0.001, loss_repr="0.001"))
    return ws, f"{METRICS}: the loss at step 7 is 0.001, the run recorded {GOOD[6]!r}"


def truncated(tmp_path):
    ws = climb(tmp_path, "m", GOOD)
    edit_metrics(ws, lambda lines: lines[:5])
    return ws, f"{METRICS} holds 5 steps of run 'eager', which ran 20 of its 20 planned steps"


def deleted(tmp_path):
    ws = climb(tmp_path, "m", GOOD)
    (ws.root / METRICS).unlink()
    return ws, f"{METRICS}, the metrics of run 'eager', is missing"


def nan_written(tmp_path):
    ws = climb(tmp_path, "m", GOOD)
    edit_metrics(ws, lambda lines: set_step(lines, 3, loss=None, loss_repr="nan"))
    return ws, f"{METRICS}: the loss at step 3 is nan, the run recorded {GOOD[2]!r}"


def relabelled_with_copied_measurements(tmp_path):
    """A failed NaN attempt edited to passed, its measurements (ledger and measurements.json) a good workspace's."""
    good, ws = climb(tmp_path, "good", GOOD), climb(tmp_path, "m", NAN)
    measurements = good.ledger.entries("eager")[0].measurements
    edit_entry(ws, lambda e: e.update(status="passed", measurements=measurements))
    edit_json(ws.root / RECORD, lambda r: r.update(measurements=measurements))
    return ws, f"its measurements say runs_whole True, but {RECORD} records run eager: the loss at step 1 is nan"


def relabelled_with_copied_record(tmp_path):
    """The same, with the good workspace's whole measurements.json and entry: only the NaN metrics stay."""
    good, ws = climb(tmp_path, "good", GOOD), climb(tmp_path, "m", NAN)
    entry = good.ledger.entries("eager")[0].to_dict()
    edit_entry(ws, lambda e: e.update(entry))
    shutil.copy(good.root / RECORD, ws.root / RECORD)
    return ws, f"{METRICS} holds 1 steps of run 'eager', which ran 20 of its 20 planned steps"


def files_read_emptied(tmp_path):
    ws = climb(tmp_path, "m", GOOD)
    edit_entry(ws, lambda e: e.update(files_read={}))
    return ws, "it records no files_read: nothing it rests on is known"


def attempt_folder_of_another_model(tmp_path):
    """Another workspace's attempt folder and entry (same name, its config.json differs), given this
    workspace's file hashes in ladder.json."""
    (tmp_path / "elsewhere").mkdir()
    other, ws = climb(tmp_path / "elsewhere", "m", GOOD, edit_config=True), climb(tmp_path, "m", GOOD)
    mine = ws.ledger.entries("eager")[0].files_read
    entry = {**other.ledger.entries("eager")[0].to_dict(), "files_read": mine}
    edit_entry(ws, lambda e: e.update(entry))
    shutil.rmtree(ws.root / "runs/eager/attempt-1")
    shutil.copytree(other.root / "runs/eager/attempt-1", ws.root / "runs/eager/attempt-1")
    return ws, f"{RECORD} says its run read config.json with sha256"


def waived_finiteness(tmp_path):
    """Waivers on finiteness and every run whole, on record before a NaN attempt, which is then edited to passed."""
    write_workspace(plan_workspace("m", tmp_path, preset="llama3/debugmodel", device="cpu"))
    ws = Workspace.load(tmp_path, "m")
    ledger = Ledger.load(ws.ledger.path)
    for criterion in ("all_finite", "every_run_whole"):
        ledger.add_waiver("eager", criterion, "it is only a toy")
    ledger.save()
    outcome = next_step(Workspace.load(tmp_path, "m"), specs=specs(NAN))
    assert outcome.status == "failed"  # the engine ignores the waivers too
    assert {c["name"] for c in outcome.criteria if not c["ok"]} >= {"all_finite", "every_run_whole"}
    edit_entry(ws, lambda e: e.update(status="passed"))
    return ws, "all_finite: all_finite = False, needs true (the waiver on record (it is only a toy) is ignored"


FORGERIES = [loss_edited, truncated, deleted, nan_written, relabelled_with_copied_measurements,
             relabelled_with_copied_record, files_read_emptied, attempt_folder_of_another_model,
             waived_finiteness]  # fmt: skip


# ---- what every reader shows --------------------------------------------------------------------
def onboard(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "1000"})


def readers(ws: Workspace) -> dict:
    """eager as status --json, recipe --json, recipe's text and REPORT.md show it."""
    base = ws.root.parent.parent
    status = onboard("status", ws.name, "--dir", base, "--json")
    recipe_json = onboard("recipe", ws.name, "--dir", base, "--json")
    recipe_text = onboard("recipe", ws.name, "--dir", base)
    report = onboard("report", ws.name, "--dir", base)
    for r in (status, recipe_json, recipe_text, report):
        assert r.exit_code == 0, r.output
    eager = next(r for r in json.loads(status.stdout)["rungs"] if r["rung"] == "eager")
    in_recipe = next(r for r in json.loads(recipe_json.stdout)["ladder"] if r["rung"] == "eager")
    return {"status": eager, "recipe": in_recipe, "recipe_text": recipe_text.stdout,
            "report": (ws.root / "REPORT.md").read_text()}  # fmt: skip


@pytest.mark.parametrize("forge", FORGERIES, ids=lambda f: f.__name__)
def test_each_forgery_is_invalid_with_its_reason_in_status_recipe_and_report(tmp_path, forge):
    ws, reason = forge(tmp_path)
    seen = readers(ws)
    assert (seen["status"]["status"], seen["status"]["recorded_status"]) == ("invalid", "passed")
    assert reason in seen["status"]["reason"], seen["status"]["reason"]
    assert seen["recipe"]["status"] == "invalid" and reason in seen["recipe"]["reason"]
    assert "not proved yet" in seen["recipe_text"] and "eager: invalid: " in seen["recipe_text"]
    assert reason in seen["recipe_text"]
    assert "| 1 | eager | **invalid** |" in seen["report"] and "**❌ Invalid**" in seen["report"]
    assert reason in seen["report"]


def test_the_untouched_workspace_reads_passed_everywhere(tmp_path):
    ws = climb(tmp_path, "m", GOOD)
    seen = readers(ws)
    assert (seen["status"]["status"], seen["status"]["reason"]) == ("passed", None)
    assert seen["recipe"]["status"] == "passed" and "eager: " not in seen["recipe_text"].split("not proved yet")[1]
    assert "| 1 | eager | **passed** |" in seen["report"] and "Invalid" not in seen["report"]
    # what the record holds: the files read, and the run with its metrics file and that file's sha256
    record = json.loads((ws.root / RECORD).read_text())
    assert set(record["files_read"]) == {"recipe.toml", "config.json", "adapter.py"}
    [run] = record["runs"]
    assert (run["run"], run["steps_planned"], run["metrics_file"], run["problem"]) == ("eager", 20, METRICS, None)
    assert run["losses"] == [repr(x) for x in GOOD] and len(run["metrics_sha256"]) == 64
    # the comparison with transformers had no checkpoint: not applicable with its reason, never a passing 0.0
    assert "step1_loss_vs_transformers" in seen["status"]["not_applicable_criteria"]
    row = "| step1_loss_vs_transformers | not applicable | not applicable: the recipe has no checkpoint.initial_hf"
    assert row in seen["report"]


def test_a_failed_nan_attempt_is_failed_not_invalid_until_someone_calls_it_passed(tmp_path):
    ws = climb(tmp_path, "m", NAN)
    assert readers(ws)["status"]["status"] == "failed"


@pytest.mark.parametrize("criterion", ["all_finite", "every_run_whole"])
def test_waive_refuses_finiteness_and_every_run_whole_in_one_line(tmp_path, criterion):
    write_workspace(plan_workspace("m", tmp_path, preset="llama3/debugmodel", device="cpu"))
    result = onboard("waive", "m", "eager", criterion, "--why", "a toy", "--dir", tmp_path)
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and f"eager/{criterion} cannot be waived" in result.stderr
    assert Ledger.load(tmp_path / "onboarding/m/ladder.json").data["waivers"] == []  # nothing written
    assert onboard("waive", "m", "eager", "loss_falls", "--why", "a toy", "--dir", tmp_path).exit_code == 0


def test_the_report_says_a_waiver_of_finiteness_counts_for_nothing(tmp_path):
    ws, _ = waived_finiteness(tmp_path)
    report = readers(ws)["report"]
    assert "| **eager** | **all_finite** | it is only a toy (**ignored**: all_finite cannot be waived" in report
    assert "| **eager** | **every_run_whole** | it is only a toy (**ignored**: every_run_whole cannot be waived" in report


def test_status_shows_a_waiver_of_finiteness_as_ignored(tmp_path):
    ws, _ = waived_finiteness(tmp_path)
    text = onboard("status", ws.name, "--dir", ws.root.parent.parent).stdout
    assert "eager/all_finite: it is only a toy" in text and "IGNORED: all_finite cannot be waived" in text
