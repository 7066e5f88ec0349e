"""The rung table: each rung of DESIGN section 1 as the ladder knows it without running it.

A rung's declaration (`Rung`) is everything `status`, `list`, `recipe` and `report` ask of it; its
runner module under onboard/rungs/ only runs it, and only the engine imports that module, by the name
declared here (onboard/engine/next_step.py, `runner_of`), so a reading command loads no rung and no torch. Tests pass a module-like fake as the runner: such a
fake is its own declaration (its `reads_recipe_key`, `not_applicable`, `evidence_problem`, `READS_EVIDENCE`,
if any).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from onboard.ladder.contract import Measurements
from onboard.ladder.gates import Checklist, load_checklist
from onboard.ladder.measurements.kernels_measurements import KernelsMeasurements
from onboard.ladder.measurements.parity_measurements import ParityMeasurements
from onboard.ladder.measurements.training_measurements import (
    CompileMeasurements, EagerMeasurements, GraphTrainerMeasurements, SimpleFsdpMeasurements, TuningMeasurements,
)  # fmt: skip
from onboard.ladder.template_check import TEST_FILE, tamper_problem
from titan_core.config.loader import ConfigError
from titan_core.config.execution_modes import MODE_KEYS

if TYPE_CHECKING:
    from onboard.workspace.layout import Workspace
    from onboard.workspace.ledger import Entry

RUNGS = ("eager", "parity", "simple_fsdp", "compile", "graph_trainer", "kernels", "tuning")

# ---- the recipe keys a rung reads and earns ---------------------------------------------------
TUNING_KEYS = frozenset({"kernels.ce_chunk", "training.batch_size", "training.grad_accum", "device.threads",
                         "device.adapt_threads", "graph_trainer.compile", "tpu.libtpu_init_flags",
                         "activation_checkpoint.mode"})  # fmt: skip
"""The recipe keys the tuning rung may edit. Its gate proves its own edits: the final recipe against
the untuned one the earlier rungs verified, on the same rows, and the final recipe run whole; so
tuning's edit of these keys leaves the earlier rungs' evidence standing (a hand edit of them, like
any hand edit, still re-verifies every rung that reads them)."""


def reads_all_but_mode(key: str) -> bool:
    """`reads_recipe_key` of a rung that runs its own execution mode: every key but the mode switches
    (titan_core's MODE_KEYS) and TUNING_KEYS, which the tuning rung proves. Every rung but kernels and
    tuning sets the mode it runs itself (eager, or its own), so an edit of a switch leaves its evidence
    standing."""
    return key not in MODE_KEYS.values() and key not in TUNING_KEYS


def reads_all_but_tuning(key: str) -> bool:
    """`reads_recipe_key` of a rung that runs the recipe's own mode: every key but TUNING_KEYS."""
    return key not in TUNING_KEYS


def reads_model_and_lora(key: str) -> bool:
    """Parity's native model comes from [model] alone (onboard.parity.native.read_workspace), and it
    proves the adapters [lora] puts on it (onboard.parity.lora_parity)."""
    return key.startswith(("model.", "lora."))


def parity_evidence_problem(ws: "Workspace", entry: "Entry") -> str | None:
    """Why a passed parity entry no longer stands: test_parity.py is not the generated file any
    more, so what it measured may not be parity."""
    try:
        return tamper_problem(ws)
    except ConfigError as e:
        return f"{ws.root / TEST_FILE} cannot be compared with its template: {e}"


# ---- the declarations ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Rung:
    """One rung as the ladder knows it without running it."""

    name: str
    measurements: type[Measurements] | None
    """What its run measures: the only names its checklist may judge (None: a fake that declares none)."""
    runner: str | None = None
    """The module with its `run(ctx)`, imported by the engine only; None: not built yet."""
    reads_recipe_key: Callable[[str], bool] | None = None
    """Whether its run depends on a "section.field" recipe key (a passed rung's edit of any other key leaves
    its evidence standing); None: it reads every key."""
    earns: frozenset[str] = field(default_factory=frozenset)
    """The recipe keys (or "section.*") a passed gate of it may write into recipe.toml."""
    not_applicable: Callable[[Any, dict], str | None] | None = None
    """`(ws, recipe) -> reason | None`, cheap and free of model building: the rule its run returns and
    `status` recomputes to check a not_applicable entry; None: it applies to every model."""
    evidence_problem: Callable[[Any, Any], str | None] | None = None
    """`(ws, entry) -> problem | None`: why a passed entry no longer stands beyond its measurements."""
    reads_evidence: frozenset[str] | None = None
    """The rungs whose evidence (passed measurements) its run and gate are given; None: every other rung's.
    An earlier rung re-verified after it passed makes it stale only where it reads that rung's evidence."""

    @classmethod
    def of_module(cls, name: str, module: ModuleType | Any) -> "Rung":
        """A module-like runner that declares itself (tests' fakes): its hooks, where it has them."""

        def hook(attr: str):
            value = getattr(module, attr, None)
            return value if callable(value) else None

        return cls(name, getattr(module, "MEASUREMENTS", None), None, hook("reads_recipe_key"),
                   not_applicable=hook("not_applicable"), evidence_problem=hook("evidence_problem"),
                   reads_evidence=getattr(module, "READS_EVIDENCE", None))  # fmt: skip


MODE_EARNS = frozenset(MODE_KEYS.values()) | {"kernels.moe"}
"""What a mode rung's pick writes: the mode it chose, and the capture-friendly experts that mode runs."""

TABLE: dict[str, Rung] = {
    r.name: r
    for r in (
        Rung("eager", EagerMeasurements, "onboard.rungs.eager_rung", reads_all_but_mode),
        Rung("parity", ParityMeasurements, "onboard.rungs.parity_rung", reads_model_and_lora,
             evidence_problem=parity_evidence_problem, reads_evidence=frozenset()),  # upstream's numbers, no rung's
        Rung("simple_fsdp", SimpleFsdpMeasurements, "onboard.rungs.simple_fsdp_rung", reads_all_but_mode,
             earns=frozenset({"training.mixed_precision_param"})),
        Rung("compile", CompileMeasurements, "onboard.rungs.compile_rung", reads_all_but_mode, earns=MODE_EARNS),
        Rung("graph_trainer", GraphTrainerMeasurements, "onboard.rungs.graph_trainer_rung", reads_all_but_mode,
             earns=MODE_EARNS),
        Rung("kernels", KernelsMeasurements, "onboard.rungs.kernels_rung.rung", reads_all_but_tuning,
             earns=frozenset({"kernels.*"})),
        Rung("tuning", TuningMeasurements, "onboard.rungs.tuning_rung.rung", earns=TUNING_KEYS),
    )
}  # fmt: skip
"""Every rung of DESIGN section 1, in ladder order (RUNGS)."""


def earns_key(rung: Rung, key: str) -> bool:
    """Whether a passed gate of `rung` may write recipe key `key` (its `earns`, "section.*" a whole section)."""
    return key in rung.earns or f"{key.split('.')[0]}.*" in rung.earns


# ---- how the ladder reaches a rung --------------------------------------------------------------
@dataclass
class RungSpec:
    """How the ladder reaches one rung: its declaration, its runner's name (the engine imports it) and its checklist."""

    name: str
    module_name: str | None
    """The runner's importable module path; None when the rung is not built yet."""
    module: ModuleType | Any = None
    """A preloaded module-like object with run(ctx) (tests pass fakes here): also its own declaration."""
    checklist: Checklist | None = None
    """A preloaded checklist; default: checklists/<name>.yaml."""

    @property
    def built(self) -> bool:
        return self.module is not None or self.module_name is not None

    @property
    def declared(self) -> Rung:
        """The rung's declaration: the table's, or, for a preloaded runner with no module name (a fake), its own."""
        if self.module_name is None and self.module is not None:
            return Rung.of_module(self.name, self.module)
        return TABLE[self.name]

    def reads_recipe_key(self):
        """The rung's `reads_recipe_key(key)`, or None: it reads every key."""
        return self.declared.reads_recipe_key

    def reads_evidence_of(self, rung: str) -> bool:
        """Whether the rung's run and gate read `rung`'s evidence (its `reads_evidence`; None: every rung's)."""
        declared = self.declared.reads_evidence
        return declared is None or rung in declared

    def load_checklist(self) -> Checklist:
        if self.checklist is None:
            self.checklist = load_checklist(self.name)
        return self.checklist


def default_specs() -> list[RungSpec]:
    """Every rung of the table; those with a runner module in onboard/rungs/ are built (found, not imported)."""
    specs = []
    for rung in RUNGS:
        runner = TABLE[rung].runner
        specs.append(RungSpec(rung, runner if runner and importlib.util.find_spec(runner) else None))
    return specs
