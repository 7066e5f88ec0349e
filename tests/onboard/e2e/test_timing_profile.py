"""The timing profile: `shipped` (the checklists' own `params.timing`) unless next-step is given
another (an argument, on the attempt's RungContext: no process state); `quick` changes the timing
params and nothing else; every attempt of a rung whose
checklist times decisions records the profile and the protocol it ran, and `status --json` and
REPORT.md say it."""

from __future__ import annotations

import json

import pytest
import yaml
from ladder_fakes import CHECKLISTS, FakeRung
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.ladder.gates import parse_checklist
from onboard.ladder.table import RUNGS, RungSpec
from onboard.engine.next_step import next_step
from onboard.report.write import write_report_files
from onboard.ladder import contract
from onboard.ladder.contract import RungContext
from onboard.rungs import gate_recipe, timing_profiles
from titan_core.measure.timing import TimingProtocol

TIMED = [r for r in RUNGS if "timing" in gate_recipe.checklist(r).params]


def test_the_rungs_that_time_decisions_and_the_shipped_default():
    assert TIMED == ["simple_fsdp", "graph_trainer", "kernels", "tuning"]  # compile's choice is graph_trainer's
    assert RungContext.__dataclass_fields__["timing_profile"].default == contract.SHIPPED == "shipped"
    for rung in TIMED:
        assert gate_recipe.param(rung, "timing") == gate_recipe.checklist(rung).params["timing"]
        assert timing_profiles.timing_params(rung) == gate_recipe.checklist(rung).params["timing"]


def test_the_quick_profile_changes_the_timing_params_and_nothing_else():
    shipped = {r: gate_recipe.checklist(r) for r in RUNGS}
    for rung in RUNGS:
        c = gate_recipe.checklist(rung)
        assert c is shipped[rung]  # the criteria and thresholds the engine judges with: as shipped
        for name, value in c.params.items():
            if name == "timing":
                quick = timing_profiles.timing_params(rung, "quick")
                assert quick == {**value, **timing_profiles.TIMING_PROFILES["quick"]} != value
            elif isinstance(value, dict) and set(value) == {"fp32", "bf16"}:  # a param per precision
                assert all(gate_recipe.param(rung, name, p) == value[p] for p in value), (rung, name)
            else:
                assert gate_recipe.param(rung, name) == value, (rung, name)
    quick = timing_profiles.protocol("kernels", "quick")
    shipped_kernels = TimingProtocol.from_dict(shipped["kernels"].params["timing"])
    assert (quick.max_rounds, quick.min_rounds, quick.max_seconds) == (3, 2, 2.0)
    assert (quick.ci_half_width, quick.confidence) == (shipped_kernels.ci_half_width, shipped_kernels.confidence)
    assert timing_profiles.protocol("kernels") == shipped_kernels  # the default stays the shipped protocol


def test_an_unknown_profile_is_refused_before_anything_runs(debug_ws):
    with pytest.raises(ValueError, match="unknown timing profile 'fast'"):
        timing_profiles.check_profile("fast")
    with pytest.raises(ValueError, match="unknown timing profile 'fast'"):
        next_step(debug_ws, specs=fake_specs(), timing_profile="fast")
    assert json.loads((debug_ws.root / "ladder.json").read_text())["attempts"] == []



def test_the_demo_refuses_an_unknown_profile_before_it_writes_anything(tmp_path):
    out = CliRunner().invoke(app, ["demo", "--timing", "fast", "--dir", str(tmp_path)])
    assert out.exit_code == 2 and "unknown timing profile 'fast'" in out.output and "quick" in out.output
    assert not (tmp_path / "onboarding").exists()


class TimingRung(FakeRung):
    """A fake rung that times with `timing_params(TIMES_AS, ctx.timing_profile)` and says what it got."""

    TIMES_AS = "kernels"

    def run(self, ctx):
        result = super().run(ctx)
        result.details["protocol_used"] = timing_profiles.timing_params(self.TIMES_AS, ctx.timing_profile)
        return result


def fake_specs() -> list[RungSpec]:
    """eager: a checklist without params.timing; parity: one with the kernels rung's timing params."""
    timed = {**CHECKLISTS["parity"], "params": {"timing": gate_recipe.checklist(TimingRung.TIMES_AS).params["timing"]}}
    lists = {"eager": CHECKLISTS["eager"], "parity": timed}
    out = []
    for rung in RUNGS:
        if rung in lists:
            checklist = parse_checklist(yaml.safe_load(yaml.safe_dump(lists[rung])), f"fake {rung}")
            module = TimingRung(rung, {"score": 2.0, "flag": True, "diff": 0.5})
            out.append(RungSpec(rung, None, module=module, checklist=checklist))
        else:
            out.append(RungSpec(rung, None))
    return out


def test_each_attempt_records_the_profile_it_timed_with_and_status_and_the_report_say_it(debug_ws):
    sp = fake_specs()
    assert [next_step(debug_ws, specs=sp, timing_profile="quick").status for _ in range(2)] == ["passed", "passed"]
    eager, parity = json.loads((debug_ws.root / "ladder.json").read_text())["attempts"]
    # a rung whose checklist times nothing has nothing to say
    assert "timing_profile" not in eager["details"] and "timing_protocol" not in eager["details"]
    d = parity["details"]
    assert d["timing_profile"] == "quick" and d["timing_protocol"] == d["protocol_used"]
    assert d["timing_protocol"]["max_rounds"] == 3 != gate_recipe.checklist("kernels").params["timing"]["max_rounds"]

    status = CliRunner().invoke(app, ["status", debug_ws.name, "--dir", str(debug_ws.root.parent.parent), "--json"])
    assert status.exit_code == 0, status.stdout
    rungs = {r["rung"]: r for r in json.loads(status.stdout)["rungs"]}
    assert (rungs["eager"]["timing_profile"], rungs["parity"]["timing_profile"]) == (None, "quick")
    report = write_report_files(debug_ws, sp).markdown.read_text()
    assert "| timing profile | quick: **shortened, not the checklist's protocol**" in report
