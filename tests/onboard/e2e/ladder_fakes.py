"""Fake rungs for engine tests: the real contract (RungContext -> RungResult), scripted results.

Also runnable as a script (see `main`) so a test can kill a process mid-rung.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from onboard.ladder.gates import parse_checklist
from onboard.ladder.table import RUNGS, RungSpec
from onboard.ladder.contract import Measurements, RungResult, flattened


@dataclass(kw_only=True)
class Scripted(Measurements):
    """A fake rung's measurements: whatever the test scripted, under the names it chose."""

    values: dict = flattened()


CHECKLISTS = {
    "eager": {
        "rung": "eager",
        "title": "fake eager",
        "criteria": [
            {"name": "score_high", "metric": "score", "comparator": ">=", "threshold": 1.0, "hint": "score too low"},
            {"name": "flag_set", "metric": "flag", "comparator": "is_true", "hint": "flag not set"},
        ],
        "human": ["a person looked"],
    },
    "parity": {
        "rung": "parity",
        "title": "fake parity",
        "criteria": [
            {
                "name": "diff_small",
                "metric": "diff",
                "comparator": "<=",
                "threshold": "evidence.eager.score",
                "hint": "diff",
            }
        ],
    },
}


class FakeRung:
    """A module-like rung whose measurements (or exception) the test scripts."""

    def __init__(
        self, rung, measurements=None, *, files=("recipe.toml",), error=None, not_applicable=None, sleep=0.0, ready=None,
        reads_evidence=None,
    ):  # fmt: skip
        self.RUNG = rung
        self.READS_EVIDENCE = reads_evidence  # the rungs whose evidence it is given (table.Rung.reads_evidence)
        self.measurements = measurements if measurements is not None else {}
        self.files = files
        self.error = error
        self.na_reason = not_applicable
        self.sleep = sleep
        self.ready = ready
        self.contexts = []

    def not_applicable(self, ws, recipe):
        """The rung's not-applicable rule (onboard.ladder.contract): the scripted reason, or None."""
        return self.na_reason

    def run(self, ctx):
        self.contexts.append(ctx)
        ctx.log(f"{self.RUNG}: fake work")
        (ctx.attempt_dir / "log.txt").write_text("fake\n")
        if self.ready:
            Path(self.ready).write_text("started")
        if self.sleep:
            time.sleep(self.sleep)
        if self.error is not None:
            raise self.error
        return RungResult(
            measurements=Scripted(values=dict(self.measurements)),
            files_read=[ctx.workspace.root / f for f in self.files],
            command=f"fake {self.RUNG}",
            not_applicable=self.not_applicable(ctx.workspace, ctx.workspace.recipe()),
            details={"device": "cpu"},
        )


def specs(eager=None, parity=None, built=("eager", "parity")):
    """RungSpecs for all rungs of the real ladder; eager/parity are fakes, the rest not built."""
    out = []
    for rung in RUNGS:
        fake = {"eager": eager, "parity": parity}.get(rung)
        if rung in built:
            fake = fake or FakeRung(rung, {"score": 2.0, "flag": True, "diff": 0.5})
            checklist = parse_checklist(yaml.safe_load(yaml.safe_dump(CHECKLISTS[rung])), f"fake {rung}")
            out.append(RungSpec(rung, None, module=fake, checklist=checklist))
        else:
            out.append(RungSpec(rung, None))
    return out


def main(argv):
    """`python ladder_fakes.py BASE NAME READY_FILE`: next-step with an eager rung that sleeps."""
    from onboard.engine.next_step import next_step
    from onboard.workspace.layout import Workspace

    base, name, ready = argv
    ws = Workspace.load(Path(base), name)
    outcome = next_step(ws, specs=specs(eager=FakeRung("eager", {"score": 2.0, "flag": True}, sleep=60, ready=ready)))
    print(outcome.status, flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
